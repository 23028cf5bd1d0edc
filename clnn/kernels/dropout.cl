## dropout.cl: inverted dropout with a counter-based mask: no mask is stored, each
## element's keep/drop is a hash of (key, element index), so the backward pass (the
## same kernel on the gradient, with the same key) drops the same elements.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
## Used by clnn/ops/dropout.py, which holds the same hash in numpy (dropout_mask).
<%include file="_common.cl"/>

// SplitMix64's finaliser (Steele, Lea and Flood 2014): a bijection of 64-bit words
// whose outputs pass BigCrush for consecutive inputs.
inline ulong clnn_mix64(ulong z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
    return z ^ (z >> 31);
}

// out = x * (keep ? scale : 0), keep when the top 32 bits of the hash of element i are
// at least ``threshold`` (= round(p 2^32), so an element is dropped with probability p).
// x * 0, not 0: a NaN input stays NaN, as in PyTorch's x * mask * scale.
__kernel void clnn_dropout(const int n, const ulong key, const uint threshold,
                           const acc_t scale,
                           __global const real_t *x, const int x_off,
                           __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH(i, n) {
        const uint h = (uint)(clnn_mix64(key + (ulong)i * 0x9E3779B97F4A7C15UL) >> 32);
        const acc_t m = h >= threshold ? scale : (acc_t)0;
        CLNN_STORE(CLNN_LOAD(x, x_off + i) * m, out, out_off + i);
    }
}
