## Shared preamble, included by every kernel template (files starting with "_" are
## helpers, not kernels). It turns the one dtype parameter into storage and arithmetic
## types, so kernel bodies never spell "float" or "double" themselves.
// dtype ${dtype}: real_t is the storage type, acc_t the type arithmetic is done in.
% if dtype == "float64":
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
## float16 needs no extension: a pointer to half and vload_half/vstore_half are core
## OpenCL 1.2, and no kernel computes in half (cl_khr_fp16 would be needed for that)
typedef ${real} real_t;
typedef ${acc} acc_t;
% if dtype == "float16":
// half is storage only: load to float, compute in float, store rounded to nearest.
#define CLNN_LOAD(p, i) vload_half((i), (p))
#define CLNN_STORE(v, p, i) vstore_half_rte((v), (i), (p))
% else:
#define CLNN_LOAD(p, i) ((acc_t)(p)[i])
#define CLNN_STORE(v, p, i) ((p)[i] = (real_t)(v))
% endif
