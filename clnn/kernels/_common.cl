## Shared preamble, included by every kernel template (files starting with "_" are
## helpers, not kernels). It turns the one dtype parameter into storage and arithmetic
## types, so kernel bodies never spell "float" or "double" themselves.
// dtype ${dtype}: real_t is the storage type, acc_t the type arithmetic is done in.
% if dtype == "float64":
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
## float16 and bfloat16 need no extension: a pointer to half and vload_half/vstore_half
## are core OpenCL 1.2, bfloat16 is kept as ushort, and no kernel computes in either
## (cl_khr_fp16 would be needed for half arithmetic)
typedef ${real} real_t;
typedef ${acc} acc_t;
<%include file="_elems.cl"/>
% if dtype == "float16":
// half is storage only: load to float, compute in float, store rounded to nearest even.
<%include file="_half.cl"/>
#define CLNN_LOAD_AT(S, p, i) CLNN_HALF_LOAD_AT(S, p, i)
#define CLNN_STORE_AT(S, v, p, i) CLNN_HALF_STORE_AT(S, v, p, i)
#define CLNN_LOADV_AT(S, n, p) CLNN_HALF_LOADV_AT(S, n, p)
#define CLNN_STOREV_AT(S, n, v, p) CLNN_HALF_STOREV_AT(S, n, v, p)
#define CLNN_BITSV(n, v) CLNN_HALF_BITSV(n, v)
% elif dtype == "bfloat16":
// bfloat16 is storage only (ushort bits): load to float, compute in float, store
// rounded to nearest even.
<%include file="_bf16.cl"/>
#define CLNN_LOAD_AT(S, p, i) CLNN_BF16_LOAD_AT(S, p, i)
#define CLNN_STORE_AT(S, v, p, i) CLNN_BF16_STORE_AT(S, v, p, i)
#define CLNN_LOADV_AT(S, n, p) CLNN_BF16_LOADV_AT(S, n, p)
#define CLNN_STOREV_AT(S, n, v, p) CLNN_BF16_STOREV_AT(S, n, v, p)
#define CLNN_BITSV(n, v) CLNN_BF16_BITSV(n, v)
% else:
#define CLNN_LOAD_AT(S, p, i) ((acc_t)(p)[i])
#define CLNN_STORE_AT(S, v, p, i) ((p)[i] = (real_t)(v))
#define CLNN_LOADV_AT(S, n, p) CLNN_ELEMS_LOAD##n(${acc}, (S const real_t *)(p))
#define CLNN_STOREV_AT(S, n, v, p) CLNN_ELEMS_STORE##n(${acc}, (v), (S real_t *)(p))
% endif
// CLNN_LOAD(p, i) / CLNN_STORE(v, p, i): element i of an array of real_t in global
// memory as acc_t, and back (rounded to nearest even where real_t is narrower);
// CLNN_LOADV(n, p) / CLNN_STOREV(n, v, p): n (2, 4 or 8) consecutive elements at p as
// an acc_t vector, and back; CLNN_BITSV(n, v) (16-bit storage only): the ushort bits
// of an acc_t vector's n elements, for stores that are not consecutive. The _AT
// forms take the address space S (__global or __local) of the pointer.
#define CLNN_LOAD(p, i) CLNN_LOAD_AT(__global, p, i)
#define CLNN_STORE(v, p, i) CLNN_STORE_AT(__global, v, p, i)
#define CLNN_LOADV(n, p) CLNN_LOADV_AT(__global, n, p)
#define CLNN_STOREV(n, v, p) CLNN_STOREV_AT(__global, n, v, p)

// CLNN_SELECT(a, b, m): b where the vector mask m is set, else a: select(a, b, m),
// except on PoCL (CLNN_POCL), which links select() as a call (ten a block of windows
// in 2x2 max pooling's backward pass, 1.6x its time), where it is OpenCL C's
// conditional operator on vectors, an instruction. (Oclgrind miscomputed that
// operator in 2x2 pooling, so the other devices keep the built-in.)
#ifdef CLNN_POCL
#define CLNN_SELECT(a, b, m) ((m) ? (b) : (a))
#else
#define CLNN_SELECT(a, b, m) select((a), (b), (m))
#endif

// clnn_lanes_sumN(v): the N lanes of partial sums kept side by side (CPU loops), added
// up in a fixed order: halves meet, (j, j + N / 2), until one is left
inline acc_t clnn_lanes_sum2(const ${acc}2 v) { return v.lo + v.hi; }
inline acc_t clnn_lanes_sum4(const ${acc}4 v) { return clnn_lanes_sum2(v.lo + v.hi); }
% if cpu_lanes >= 8:
inline acc_t clnn_lanes_sum8(const ${acc}8 v) { return clnn_lanes_sum4(v.lo + v.hi); }
% endif

// CLNN_FOR_EACH(i, n): every i in [0, n) once, over any global size. A GPU strides by
// the grid (neighbouring work-items touch neighbouring elements: coalesced); a CPU runs
// a work-group as a loop over its work-items, so there each takes one contiguous chunk
// (a 16M-element scale on PoCL: 8 ms, against 99 ms striding by the grid).
#ifdef CLNN_CPU
#define CLNN_CHUNK(n) (((n) - 1) / (int)get_global_size(0) + 1)
#define CLNN_FOR_EACH(i, n) \
    for (int i = (int)get_global_id(0) * CLNN_CHUNK(n), i##_end = min((n), i + CLNN_CHUNK(n)); \
         i < i##_end; ++i)
#else
#define CLNN_FOR_EACH(i, n) for (int i = (int)get_global_id(0); i < (n); i += (int)get_global_size(0))
#endif
