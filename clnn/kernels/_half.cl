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
// one element of half storage at p[i] in address space S (__global, __local) as float
// and back: clnn's conversions on CPUs, the core built-ins (one instruction each on
// GPUs) elsewhere. n (2, 4, 8) consecutive ones at p as a float vector: the core
// vector built-ins everywhere. PoCL compiles vload_half8/vstore_half8_rte to the x86
// F16C instructions (vcvtph2ps, vcvtps2ph), which clnn's conversions on vectors of
// integers did not reach (measured on a Zen 3, 16M halves: a float16 tanh 35 -> 22 ms,
// softmax 2048^2 13.5 -> 7.8, a sum 7.4 -> 4.9, 2x2 max pooling 12.3 -> 6.7); the
// scalar built-ins stay calls, which is why the scalar forms above exist.
#define CLNN_HALF_LOAD_AT(S, p, i) clnn_h2f(((S const ushort *)(p))[i])
#define CLNN_HALF_STORE_AT(S, v, p, i) (((S ushort *)(p))[i] = clnn_f2h(v))
#if defined(CLNN_POCL) && defined(__x86_64__) && defined(__F16C__)
// x86 with F16C, where the compiler takes GNU inline assembly (PoCL's clang: the
// routine defines CLNN_POCL): the vectors' bits move as ushorts and
// vcvtph2ps / vcvtps2ph (rounding to nearest even) convert them in registers. PoCL 3.0
// links vload_half8 and its kind as calls (push, vcvtph2ps, pop, ret), and a call
// clobbers every vector register: a float16 GEMM's accumulators went to the stack and
// back around each load (LeNet-5's dense layers 2-4x float32's time in the direct
// kernel). The same bits as the built-ins (tests/test_programs.py).
#define CLNN_HALF_F16C 1
inline float8 clnn_h2f8(const ushort8 h)
{
    float8 f;
    __asm__("vcvtph2ps %1, %0" : "=x"(f) : "x"(h));
    return f;
}
// (4 halves travel as the low half of a 128-bit ushort8: a 64-bit vector operand
// reached the instruction wrongly, PoCL 3.0)
inline float4 clnn_h2f4(const ushort4 h)
{
    float4 f;
    __asm__("vcvtph2ps %1, %0" : "=x"(f) : "x"((ushort8)(h, h)));
    return f;
}
inline float2 clnn_h2f2(const ushort2 h) { return clnn_h2f4((ushort4)(h, h)).lo; }
inline ushort8 clnn_f2h8(const float8 v)
{
    ushort8 h;
    __asm__("vcvtps2ph $0, %1, %0" : "=x"(h) : "x"(v));
    return h;
}
inline ushort4 clnn_f2h4(const float4 v)
{
    ushort8 h;
    __asm__("vcvtps2ph $0, %1, %0" : "=x"(h) : "x"(v));
    return h.lo;
}
inline ushort2 clnn_f2h2(const float2 v) { return clnn_f2h4((float4)(v, v)).lo; }
#define CLNN_HALF_LOADV_AT(S, n, p) clnn_h2f##n(CLNN_ELEMS_LOAD##n(ushort, (S const ushort *)(p)))
#define CLNN_HALF_STOREV_AT(S, n, v, p) CLNN_ELEMS_STORE##n(ushort, clnn_f2h##n(v), (S ushort *)(p))
#define CLNN_HALF_BITSV(n, v) clnn_f2h##n(v)
#else
// CLNN_HALF_BITSV(n, v): n (2, 4, 8) floats as the bits of their halves, converted as
// one vector (by the built-in, in private memory) for a caller that stores them
// apart (a strided row of C): converting each with clnn_f2h took a quarter of a
// float16 LeNet C3 forward pass on PoCL
% for n in (2, 4, 8):
inline ushort${n} clnn_half_bits${n}(const float${n} v)
{
    ushort${n} bits;
    vstore_half${n}_rte(v, 0, (__private half *)&bits);
    return bits;
}
% endfor
#define CLNN_HALF_BITSV(n, v) clnn_half_bits##n(v)
#ifdef CLNN_HALF_BITS
// The vectors' bits move as ushorts and the built-ins convert them in private memory
// (programs.cpu_options sets CLNN_HALF_BITS from PoCL 3.1 on): PoCL 3.1 (Debian 12's,
// LLVM 15) compiled vload_half8 and its kind on global memory so that a float16
// kernel on an array at an odd element offset (a view, the tests' guarded arrays)
// crashed its process, where the spec asks only for a half's alignment. PoCL 3.0
// runs the built-ins 1.2-1.5x faster than this form (float16 tanh, softmax, pooling).
% for S in ("__global", "__local"):
%   for n in (2, 4, 8):
inline float${n} clnn_half_loadv${n}${S}(${S} const half *p)
{
    const ushort${n} bits = vload${n}(0, (${S} const ushort *)p);
    return vload_half${n}(0, (const __private half *)&bits);
}
inline void clnn_half_storev${n}${S}(const float${n} v, ${S} half *p)
{
    vstore${n}(clnn_half_bits${n}(v), 0, (${S} ushort *)p);
}
%   endfor
% endfor
#define CLNN_HALF_LOADV_AT(S, n, p) clnn_half_loadv##n##S(p)
#define CLNN_HALF_STOREV_AT(S, n, v, p) clnn_half_storev##n##S((v), (p))
#else
#define CLNN_HALF_LOADV_AT(S, n, p) vload_half##n(0, (p))
#define CLNN_HALF_STOREV_AT(S, n, v, p) vstore_half##n##_rte((v), 0, (p))
#endif
#endif
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
