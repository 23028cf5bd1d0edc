## transpose.cl: y = x^T for a rows x cols matrix, moved as raw bits (no arithmetic, so
## any dtype, with no extension: float64 moves as ulong, the 16-bit types as ushort).
## Parameters:  dtype  float32 | float64 | float16 | bfloat16 (only its size matters)
## Used by clnn/ops/gemm.py: a GEMM whose operands are not both stored along k, on a
## WGMMA row (Hopper's engines read K-major tiles fastest), first copies them so.
<%
    bits_t = {"float32": "uint", "float64": "ulong", "float16": "ushort",
              "bfloat16": "ushort"}[dtype]
%>
#define CLNN_TT 32      // a tile of 32 x 32 elements per work-group
#define CLNN_TR 8       // work-items along its rows: each moves 4 of the tile's rows

// Each work-group reads its tile along x's rows (a warp's 32 neighbours read one
// contiguous row) into local memory, and writes it along y's rows (the tile's
// columns). The tile's extra column puts a column's 32 elements in 32 different
// banks, so the column reads do not conflict.
__kernel __attribute__((reqd_work_group_size(CLNN_TT, CLNN_TR, 1)))
void clnn_transpose(const int rows, const int cols,
                    __global const ${bits_t} *restrict x, const int x_off, const int ldx,
                    __global ${bits_t} *restrict y, const int y_off, const int ldy)
{
    __local ${bits_t} tile[CLNN_TT][CLNN_TT + 1];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int c0 = get_group_id(0) * CLNN_TT, r0 = get_group_id(1) * CLNN_TT;
    for (int k = ty; k < CLNN_TT; k += CLNN_TR) {
        const int r = r0 + k, c = c0 + tx;
        if (r < rows && c < cols)
            tile[k][tx] = x[x_off + (size_t)r * ldx + c];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = ty; k < CLNN_TT; k += CLNN_TR) {
        const int c = c0 + k, r = r0 + tx;
        if (c < cols && r < rows)
            y[y_off + (size_t)c * ldy + r] = tile[tx][k];
    }
}
