## _wg.cl: work-group reductions for the row-wise kernels of GPUs (softmax.cl, loss.cl),
## where a work-group of WG work-items shares one row. args: wg (a power of two).
<%page args="wg"/>
#define CLNN_WG ${wg}    // work-items per row

// The sum or maximum of v over the work-group, which every work-item gets back. The
// partial values meet in a tree in local memory, always in the same pairs, so the
// result is bitwise the same whatever the device's scheduling. Every work-item of the
// group must call it (it holds barriers).
<% combines = (("sum", "scratch[lid] + scratch[lid + s]"),
               ("max", "fmax(scratch[lid], scratch[lid + s])")) %>
% for name, combine in combines:
inline acc_t clnn_wg_${name}(__local acc_t *scratch, const acc_t v)
{
    const int lid = (int)get_local_id(0);
    scratch[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = CLNN_WG / 2; s > 0; s >>= 1) {
        if (lid < s)
            scratch[lid] = ${combine};
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const acc_t r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);   // scratch is reused by the next call
    return r;
}
% endfor
