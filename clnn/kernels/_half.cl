## _half.cl: float16 loads and stores (CLNN_HALF_*), with their float16 <-> float32
## conversions for CPUs; included by _common.cl (float16 kernels) and cast.cl (a
## float16 source). Not a kernel.
#ifndef CLNN_HALF_CONVERSIONS
#define CLNN_HALF_CONVERSIONS
#ifdef CLNN_CPU
// On CPUs (PoCL) the scalar vload_half/vstore_half_rte are calls the work-group loop
// does not vectorise: 25 and 43 ms for 16M elements, against 6.5 and 6.8 ms for these
// integer conversions, which give the same bits (tests/ops/test_cast.py checks every
// half, and float32 ties, boundaries, subnormals, inf and NaN against numpy).
// half -> float: a normal half's exponent and mantissa shifted into a float's place
// and its exponent rebiased (+112) in the integer bits; a subnormal half (and zero)
// is its mantissa times 2^-24, converted from the integer (multiplying a float
// subnormal by 2^112 instead took a microcode assist per element on x86: a float16
// gradient full of tiny values ran 5x slower); inf and NaN get the float's all-ones
// exponent; then the sign. No branches: the three are computed and one selected.
inline float clnn_h2f(const ushort h)
{
    const uint em = h & 0x7fffu;
    const float f = em >= 0x7c00u ? as_float((em << 13) | 0x7f800000u)
                  : em >= 0x0400u ? as_float((em << 13) + 0x38000000u)
                                  : (float)(int)em * 0x1p-24f;
    return as_float(as_uint(f) | ((uint)(h & 0x8000u) << 16));
}

// float -> half, rounded to nearest even: |v| >= 65536 (after rounding anything from
// 65520 up) is inf, NaN stays NaN (quiet); a result below the smallest normal half is
// rounded by a float addition that aligns its bits (the FPU rounds to nearest even);
// a normal result is rebiased in the integer bits, with the rounding increment
// 0xfff plus the kept mantissa's last bit (ties to even).
// All three cases are computed and one selected, without branches: the loops that
// store half then vectorise, and data mixing zeros with normal values (relu's
// gradients) no longer mispredict (a LeNet-5 activation gradient 1.2 -> 0.1 ms).
inline ushort clnn_f2h(const float v)
{
    const uint x = as_uint(v);
    const uint a = x & 0x7fffffffu;
    const uint big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
    const uint small = as_uint(as_float(a) + 0.5f) - 0x3f000000u;
    const uint normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
    const uint h = a >= 0x47800000u ? big : (a < 0x38800000u ? small : normal);
    return (ushort)(h | ((x >> 16) & 0x8000u));
}
// clnn_f2h2/4/8: the same rounding on a vector of floats at once, for a kernel that
// stores a vector of halves (the CPU GEMM's epilogue). select(a, b, m): b where m, else
// a (the vector ?: means the same, but Oclgrind got it wrong in 2x2 pooling).
#define CLNN_F2H_VECTOR(N) \
inline ushort##N clnn_f2h##N(const float##N v) \
{ \
    const uint##N x = as_uint##N(v); \
    const uint##N a = x & 0x7fffffffu; \
    const uint##N big = select((uint##N)0x7c00u, (uint##N)0x7e00u, a > 0x7f800000u); \
    const uint##N small = as_uint##N(as_float##N(a) + 0.5f) - 0x3f000000u; \
    const uint##N normal = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13; \
    const uint##N h = select(select(normal, small, a < 0x38800000u), big, \
                             a >= 0x47800000u); \
    return convert_ushort##N(h | ((x >> 16) & 0x8000u)); \
}
CLNN_F2H_VECTOR(2)
CLNN_F2H_VECTOR(4)
CLNN_F2H_VECTOR(8)
// clnn_h2f2/4/8: clnn_h2f on a vector of halves' bits at once
#define CLNN_H2F_VECTOR(N) \
inline float##N clnn_h2f##N(const ushort##N h) \
{ \
    const uint##N em = convert_uint##N(h) & 0x7fffu; \
    const float##N f = select(select(convert_float##N(as_int##N(em)) * 0x1p-24f, \
                                     as_float##N((em << 13) + 0x38000000u), \
                                     em >= 0x0400u), \
                              as_float##N((em << 13) | 0x7f800000u), em >= 0x7c00u); \
    return as_float##N(as_uint##N(f) | ((convert_uint##N(h) & 0x8000u) << 16)); \
}
CLNN_H2F_VECTOR(2)
CLNN_H2F_VECTOR(4)
CLNN_H2F_VECTOR(8)
// one element of half storage at p[i] in address space S (__global, __local) as float
// and back, or n (2, 4, 8) consecutive ones at p as a float vector: clnn's conversions
// on CPUs, the core built-ins (one instruction each on GPUs) elsewhere
#define CLNN_HALF_LOAD_AT(S, p, i) clnn_h2f(((S const ushort *)(p))[i])
#define CLNN_HALF_STORE_AT(S, v, p, i) (((S ushort *)(p))[i] = clnn_f2h(v))
#define CLNN_HALF_LOADV_AT(S, n, p) clnn_h2f##n(CLNN_ELEMS_LOAD##n(ushort, (S const ushort *)(p)))
#define CLNN_HALF_STOREV_AT(S, n, v, p) CLNN_ELEMS_STORE##n(ushort, clnn_f2h##n(v), (S ushort *)(p))
#else
#define CLNN_HALF_LOAD_AT(S, p, i) vload_half((i), (p))
#define CLNN_HALF_STORE_AT(S, v, p, i) vstore_half_rte((v), (i), (p))
#define CLNN_HALF_LOADV_AT(S, n, p) vload_half##n(0, (p))
#define CLNN_HALF_STOREV_AT(S, n, v, p) vstore_half##n##_rte((v), 0, (p))
#endif
// the same in global memory, where kernels keep their arrays
#define CLNN_HALF_LOAD(p, i) CLNN_HALF_LOAD_AT(__global, p, i)
#define CLNN_HALF_STORE(v, p, i) CLNN_HALF_STORE_AT(__global, v, p, i)
#define CLNN_HALF_LOADV(n, p) CLNN_HALF_LOADV_AT(__global, n, p)
#define CLNN_HALF_STOREV(n, v, p) CLNN_HALF_STOREV_AT(__global, n, v, p)
#endif
