## _bf16.cl: bfloat16 loads and stores (CLNN_BF16_*); included by _common.cl (bfloat16
## kernels) and cast.cl (a bfloat16 source). Not a kernel.
## bfloat16 is the top 16 bits of a float32 (8 exponent bits, 7 mantissa bits): storage
## only, kept as ushort, so no device needs an extension or a built-in for it.
#ifndef CLNN_BF16_CONVERSIONS
#define CLNN_BF16_CONVERSIONS
// bfloat16 -> float: exact, the bits shifted into the top half.
inline float clnn_bf2f(const ushort b)
{
    return as_float((uint)b << 16);
}

// float -> bfloat16, rounded to nearest even: the increment 0x7fff plus the kept
// mantissa's last bit carries into the kept bits exactly when the dropped half is
// above a tie, or a tie with an odd last bit; a carry out of the largest finite value
// gives inf, as it should. NaN is kept a (quiet) NaN: rounding its bits could make it
// inf. No branches: both are computed and one selected.
inline ushort clnn_f2bf(const float v)
{
    const uint x = as_uint(v);
    const uint r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (ushort)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : r);
}
// the same on vectors of 2, 4 or 8 (select(a, b, m): b where m, else a)
#define CLNN_BF16_VECTOR(N) \
inline float##N clnn_bf2f##N(const ushort##N b) \
{ \
    return as_float##N(convert_uint##N(b) << 16); \
} \
inline ushort##N clnn_f2bf##N(const float##N v) \
{ \
    const uint##N x = as_uint##N(v); \
    const uint##N r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16; \
    return convert_ushort##N(select(r, (x >> 16) | 0x40u, (x & 0x7fffffffu) > 0x7f800000u)); \
}
CLNN_BF16_VECTOR(2)
CLNN_BF16_VECTOR(4)
CLNN_BF16_VECTOR(8)
// one element of bfloat16 storage at p[i] in address space S (__global, __local) as
// float and back, or n (2, 4, 8) consecutive ones at p as a float vector
#define CLNN_BF16_LOAD_AT(S, p, i) clnn_bf2f(((S const ushort *)(p))[i])
#define CLNN_BF16_STORE_AT(S, v, p, i) (((S ushort *)(p))[i] = clnn_f2bf(v))
#define CLNN_BF16_LOADV_AT(S, n, p) clnn_bf2f##n(CLNN_ELEMS_LOAD##n(ushort, (S const ushort *)(p)))
#define CLNN_BF16_STOREV_AT(S, n, v, p) CLNN_ELEMS_STORE##n(ushort, clnn_f2bf##n(v), (S ushort *)(p))
#define CLNN_BF16_BITSV(n, v) clnn_f2bf##n(v)
#define CLNN_BF16_LOAD(p, i) CLNN_BF16_LOAD_AT(__global, p, i)
#endif
