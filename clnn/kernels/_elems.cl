## _elems.cl: CLNN_ELEMS_LOADn(T, P) / CLNN_ELEMS_STOREn(T, V, P): n (2, 4 or 8)
## consecutive elements at the pointer P as a vector of type Tn, and back (float and
## double data, and the ushort bits of 16-bit storage); included by _common.cl, under
## CLNN_LOADV/CLNN_STOREV. Not a kernel.
#ifndef CLNN_ELEMS
#define CLNN_ELEMS
#ifdef CLNN_CPU
// CPUs: element by element at constant offsets from the pointer, which the compiler
// merges into one vector load or store (PoCL's vloadN/vstoreN came out as N scalar
// inserts or extracts). P is a pointer expression in parentheses, read once per element.
#define CLNN_ELEMS_LOAD2(T, P) ((T##2)((P)[0], (P)[1]))
#define CLNN_ELEMS_LOAD4(T, P) ((T##4)((P)[0], (P)[1], (P)[2], (P)[3]))
#define CLNN_ELEMS_LOAD8(T, P) ((T##8)((P)[0], (P)[1], (P)[2], (P)[3], (P)[4], (P)[5], (P)[6], (P)[7]))
#define CLNN_ELEMS_STORE2(T, V, P) do { const T##2 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; } while (0)
#define CLNN_ELEMS_STORE4(T, V, P) do { const T##4 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; \
    (P)[2] = v_.s2; (P)[3] = v_.s3; } while (0)
#define CLNN_ELEMS_STORE8(T, V, P) do { const T##8 v_ = (V); (P)[0] = v_.s0; (P)[1] = v_.s1; \
    (P)[2] = v_.s2; (P)[3] = v_.s3; (P)[4] = v_.s4; (P)[5] = v_.s5; (P)[6] = v_.s6; \
    (P)[7] = v_.s7; } while (0)
#else
#define CLNN_ELEMS_LOAD2(T, P) vload2(0, P)
#define CLNN_ELEMS_LOAD4(T, P) vload4(0, P)
#define CLNN_ELEMS_LOAD8(T, P) vload8(0, P)
#define CLNN_ELEMS_STORE2(T, V, P) vstore2(V, 0, P)
#define CLNN_ELEMS_STORE4(T, V, P) vstore4(V, 0, P)
#define CLNN_ELEMS_STORE8(T, V, P) vstore8(V, 0, P)
#endif
#endif
