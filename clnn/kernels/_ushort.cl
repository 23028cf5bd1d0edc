## _ushort.cl: vectors of 2, 4 or 8 ushorts (16-bit storage's bits) loaded from and
## stored to consecutive elements at a pointer; included by _half.cl and _bf16.cl.
## Not a kernel.
#ifndef CLNN_USHORT_VECTORS
#define CLNN_USHORT_VECTORS
#ifdef CLNN_CPU
// CPUs: element by element at constant offsets from the pointer, which the compiler
// merges into one vector load or store (PoCL's vloadN/vstoreN came out as N scalar
// inserts or extracts). P is a pointer expression in parentheses, read once per element.
#define CLNN_US_LOAD2(P) ((ushort2)((P)[0], (P)[1]))
#define CLNN_US_LOAD4(P) ((ushort4)((P)[0], (P)[1], (P)[2], (P)[3]))
#define CLNN_US_LOAD8(P) ((ushort8)((P)[0], (P)[1], (P)[2], (P)[3], (P)[4], (P)[5], (P)[6], (P)[7]))
#define CLNN_US_STORE2(V, P) do { const ushort2 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; } while (0)
#define CLNN_US_STORE4(V, P) do { const ushort4 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; \
    (P)[2] = v_.s2; (P)[3] = v_.s3; } while (0)
#define CLNN_US_STORE8(V, P) do { const ushort8 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; \
    (P)[2] = v_.s2; (P)[3] = v_.s3; (P)[4] = v_.s4; (P)[5] = v_.s5; (P)[6] = v_.s6; \
    (P)[7] = v_.s7; } while (0)
#else
#define CLNN_US_LOAD2(P) vload2(0, P)
#define CLNN_US_LOAD4(P) vload4(0, P)
#define CLNN_US_LOAD8(P) vload8(0, P)
#define CLNN_US_STORE2(V, P) vstore2(V, 0, P)
#define CLNN_US_STORE4(V, P) vstore4(V, 0, P)
#define CLNN_US_STORE8(V, P) vstore8(V, 0, P)
#endif
#endif
