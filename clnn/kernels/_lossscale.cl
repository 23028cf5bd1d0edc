## _lossscale.cl: dynamic loss scaling's state on the device and its update after a
## step (clnn/nn/amp.py's GradScaler, whose semantics are PyTorch's); included by
## optim.cl (clnn_loss_scale_update) and cast.cl (the checked gradients' cast, whose
## last work-group applies it). Not a kernel.
#ifndef CLNN_LOSS_SCALE
#define CLNN_LOSS_SCALE
// Seven floats, three of them holding ints' bits:
#define CLNN_LS_SCALE 0     // S, the loss scale of the next step
#define CLNN_LS_FOUND 1     // 1 when this step's gradients held an inf or NaN, else 0
#define CLNN_LS_USED 2      // the S this step's gradients were computed with
#define CLNN_LS_GOOD 3      // good steps in a row (int)
#define CLNN_LS_SKIPPED 4   // steps skipped so far (int)
#define CLNN_LS_MARK 5      // 1 where cast.cl's checked cast met an inf or NaN, else 0
#define CLNN_LS_DONE 6      // work-groups of the checked cast finished so far (int; 0
                            // between launches)

// The update after a step, by one work-item, from ``found`` (nonzero: the step's
// gradients held an inf or NaN). A step that overflowed is skipped and S times
// backoff; after ``interval`` good steps in a row, S times growth. ``count``, the
// optimizer's count of the updates applied (Adam's t), goes up by one for a step that
// is not skipped. The host reads none of it during training.
inline void clnn_loss_scale_apply(__global float *state, const int found,
                                  __global int *count, const float growth,
                                  const float backoff, const int interval)
{
    const float s = state[CLNN_LS_SCALE];
    state[CLNN_LS_USED] = s;
    if (!found) {
        int good = as_int(state[CLNN_LS_GOOD]) + 1;
        state[CLNN_LS_FOUND] = 0.0f;
        if (good >= interval) {
            state[CLNN_LS_SCALE] = s * growth;
            good = 0;
        }
        state[CLNN_LS_GOOD] = as_float(good);
        *count += 1;
    } else {
        state[CLNN_LS_FOUND] = 1.0f;
        state[CLNN_LS_SCALE] = s * backoff;
        state[CLNN_LS_GOOD] = as_float(0);
        state[CLNN_LS_SKIPPED] = as_float(as_int(state[CLNN_LS_SKIPPED]) + 1);
    }
}
#endif
