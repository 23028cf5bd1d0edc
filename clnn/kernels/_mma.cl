## _mma.cl: NVIDIA's mma.sync through inline PTX, and the same instruction emulated in
## OpenCL C for tests (PoCL, Oclgrind). Shared by gemm.cl's engine rows and convt.cl's
## engine variant. Not a kernel.
## args: MMA       "tf32" (m16n8k8, float32 operands rounded to TF32) or "f16" (m16n8k16,
##                 float16 or bfloat16 operands by dtype)
##       EMULATE   define clnn_mma_dot (the emulation's output of a 16 x 8 tile) instead
##                 of the instruction CLNN_MMA
##       mma_sync  False: neither (WGMMA rows, which use only clnn_tf32)
## Also a def, imported through <%namespace>: step(MT, NTL, me, row, emulate), one k
## step of a warp's fragments (see there).
<%page args="MMA, EMULATE, mma_sync=True"/>
// ---- matrix engines: NVIDIA's mma.sync (compute capability 8.0 and up) through inline
// PTX, which NVIDIA's OpenCL compiler accepts; this variant is chosen only there (see
// clnn/tuning.py). A warp multiplies a 16 x KI tile of A by a KI x 8 tile of B into a
// 16 x 8 tile of C held as 4 floats per lane: lane (g, t4) holds C(g, 2 t4 + {0, 1})
// and C(g + 8, 2 t4 + {0, 1}). Sums are float32 either way.
% if MMA == "tf32":
// TF32 (float32 operands rounded to 10 mantissa bits, as PyTorch's "high" float32
// matmul precision): A fragment a0..a3 = A(g, t4), A(g + 8, t4), A(g, t4 + 4),
// A(g + 8, t4 + 4); B fragment b0, b1 = B(t4, g), B(t4 + 4, g).
%   if mma_sync and not EMULATE:
#define CLNN_MMA(d, a0, a1, a2, a3, b0, b1) \
    __asm__ __volatile__("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
                 : "+f"(d##_0), "+f"(d##_1), "+f"(d##_2), "+f"(d##_3) \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
%   endif
// float32 to TF32, rounding to nearest (ties away, as cvt.rna.tf32.f32); done once per
// element as the tiles go to local memory (on ASYNC rows, whose copies bypass the
// registers, as fragments load). NaN stays NaN.
inline float clnn_tf32(const float x)
{
    const uint u = as_uint(x);
    return (u & 0x7fffffffu) > 0x7f800000u ? x : as_float((u + 0x1000u) & 0xffffe000u);
}
% else:
// float16 (or bfloat16: the same layouts, the instruction's types .bf16) operands, two
// to a 32-bit register (the lower k in the low half):
// A fragment a0..a3 = A(g, 2 t4 + {0, 1}), A(g + 8, ...), A(g, 2 t4 + 8 + {0, 1}),
// A(g + 8, ...); B fragment b0, b1 = B(2 t4 + {0, 1}, g), B(2 t4 + 8 + {0, 1}, g).
// The tiles go to local memory as halves in exactly these pairs (store_half_pairs), so a
// fragment register is one 32-bit load.
%   if mma_sync and not EMULATE:
#define CLNN_MMA(d, a0, a1, a2, a3, b0, b1) \
    __asm__ __volatile__("mma.sync.aligned.m16n8k16.row.col.f32.${"bf16.bf16" if dtype == "bfloat16" else "f16.f16"}.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};" \
                 : "+f"(d##_0), "+f"(d##_1), "+f"(d##_2), "+f"(d##_3) \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))
%   endif
% endif
% if EMULATE and mma_sync:

// The engine emulated in OpenCL C, for testing this kernel where there is no such
// engine (PoCL, Oclgrind): at each k step the lanes put all their fragment registers
// in local memory (mma_exchange, XR registers each), and each lane sums the outputs it
// holds from the fragments of its warp, as mma.sync's operand layouts above define
// them. Every work-item of the group takes the same steps, so the barriers are legal.
// clnn_mma_dot is the (row, col) output of one 16 x 8 tile: w is the warp's registers,
// the A fragment at register ra of each lane, the B fragment at register rb.
inline float clnn_mma_dot(__local const uint *w, const int xr, const int ra, const int rb,
                          const int row, const int col)
{
    float s = 0.0f;
%   if MMA == "tf32":
    // A(row, k): lane (row % 8) * 4 + k % 4, register ra + (row >= 8) + 2 (k >= 4);
    // B(k, col): lane col * 4 + k % 4, register rb + (k >= 4); the engine reads a
    // register's top 19 bits (the rows that round leave the others zero)
#pragma unroll 1
    for (int k = 0; k < 8; ++k)
        s += as_float(w[((row % 8) * 4 + k % 4) * xr + ra + (row >= 8) + 2 * (k >= 4)] & 0xffffe000u) *
             as_float(w[(col * 4 + k % 4) * xr + rb + (k >= 4)] & 0xffffe000u);
%   else:
    // A(row, k): half k % 2 of lane (row % 8) * 4 + k % 8 / 2, register
    // ra + (row >= 8) + 2 (k >= 8); B(k, col): half k % 2 of lane col * 4 + k % 8 / 2,
    // register rb + (k >= 8)
#pragma unroll 1
    for (int k = 0; k < 16; ++k)
        s += CLNN_LOAD_AT(__local, (__local const real_t *)(w + ((row % 8) * 4 + k % 8 / 2) * xr + ra + (row >= 8) + 2 * (k >= 8)), k % 2) *
             CLNN_LOAD_AT(__local, (__local const real_t *)(w + (col * 4 + k % 8 / 2) * xr + rb + (k >= 8)), k % 2);
%   endif
    return s;
}
% endif
## step(MT, NTL, me, row, emulate): one k step of a warp's MT x NTL tiles of 16 x 8: A
## fragments a{i}_0..3 (rows 16 i on), B fragments b{j}_0..1 (columns 8 j on), added into
## the accumulators d{i}_{j}_0..3. With ``emulate`` (EMULATE), the lanes put their
## fragment registers into local memory (mma_exchange, 4 MT + 2 NTL words a work-item,
## ``me`` the work-item's index there and ``lane`` its lane) and each sums what it
## holds, lane (``row``, t4); every work-item of the group must take the same steps.
<%def name="step(MT, NTL, me, row, emulate)">\
<% XR = 4 * MT + 2 * NTL %>\
% if emulate:
            {   // the engine, emulated: the warp's fragment registers through local memory
                __local uint *mine = mma_exchange + ${me} * ${XR};
                barrier(CLK_LOCAL_MEM_FENCE);       // the previous step's reads are done
%   for i in range(MT):
                ${" ".join(f"mine[{4 * i + r}] = a{i}_{r};" for r in range(4))}
%   endfor
%   for j in range(NTL):
                ${" ".join(f"mine[{4 * MT + 2 * j + r}] = b{j}_{r};" for r in range(2))}
%   endfor
                barrier(CLK_LOCAL_MEM_FENCE);
                __local const uint *xw = mma_exchange + (${me} - lane) * ${XR};
                // one call site in a loop that stays a loop: emulation is for tests,
                // and PoCL builds the unrolled form for minutes
                float sums[${MT * NTL * 4}];
#pragma unroll 1
                for (int q = 0; q < ${MT * NTL * 4}; ++q) {
                    const int i = q / ${NTL * 4}, j = q / 4 % ${NTL}, r = q % 4;
                    sums[q] = clnn_mma_dot(xw, ${XR}, 4 * i, ${4 * MT} + 2 * j,
                                           ${row} + 8 * (r / 2), 2 * t4 + r % 2);
                }
%   for i in range(MT):
%     for j in range(NTL):
                ${" ".join(f"d{i}_{j}_{r} += sums[{(i * NTL + j) * 4 + r}];" for r in range(4))}
%     endfor
%   endfor
            }
% else:
%   for i in range(MT):
%     for j in range(NTL):
            CLNN_MMA(d${i}_${j}, a${i}_0, a${i}_1, a${i}_2, a${i}_3, b${j}_0, b${j}_1);
%     endfor
%   endfor
% endif
</%def>\
