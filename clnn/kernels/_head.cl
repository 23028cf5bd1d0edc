## _head.cl: a small batch's loss in one launch (defs, called through <%namespace>
## from softmax.cl and loss.cl; the including template has included _wg.cl with
## wg=head). Not a kernel.
##
## One work-group takes every row: a work-item per row (rows lid, lid + WG, ...), its
## per-row losses summed as it goes, then across the group in _wg.cl's fixed tree, and
## the mean (times ``post``, 1/batch) stored: what the row kernel's launch, a loss
## buffer and a reduction's launch did. With ``with_db`` the group then sums each
## column of the gradient as stored (a dense output layer's bias gradient: what
## bias_grad's launch did), each work-item over its own rows and then in the tree. For
## the short rows of a classifier's head (fewer than 32 classes, which GPUs too run a
## work-item per row) and batches of up to clnn/ops/loss.py's HEAD_ROWS: there the
## launches cost more than the work. Bitwise reproducible: every sum in a fixed order.

## The kernel ``entry``_head, the prediction ``p`` and gradient ``g`` named as the row
## kernel names them; ``row()`` the row kernel's body for row r, which defines
## ``loss_r`` (gs, the gradient's factor, in scope).
<%def name="head_kernel(entry, p, g, row)">
__kernel __attribute__((reqd_work_group_size(CLNN_WG, 1, 1)))
void ${entry}_head(const int rows, const int cols, const acc_t grad_scale,
% if dscale:
                   __global const float *scale_by, const int sb_off,
% endif
                   __global const real_t *${p}, const int ${p}_off,
                   __global const real_t *y, const int y_off,
                   __global real_t *${g}, const int ${g}_off,
                   const acc_t post,
                   __global ${"acc_t" if lossout == "acc" else "real_t"} *loss,
                   const int loss_off,
                   const int with_db, __global real_t *db, const int db_off)
{
    __local acc_t scratch[CLNN_WG];
    const int lid = (int)get_local_id(0);
    const acc_t gs = grad_scale${" * (acc_t)scale_by[sb_off]" if dscale else ""};
    acc_t part = (acc_t)0;
    for (int r = lid; r < rows; r += CLNN_WG) {
${row()}\
        part += loss_r;
    }
    part = clnn_wg_sum(scratch, part);
    if (lid == 0) {
% if lossout == "acc":
        loss[loss_off] = part * post;
% else:
        CLNN_STORE(part * post, loss, loss_off);
% endif
    }
    if (with_db) {
        // each work-item sums the rows it stored itself (the same r as above), so
        // every value it reads is its own write: no barrier before the tree
        for (int j = 0; j < cols; ++j) {
            acc_t s = (acc_t)0;
            for (int r = lid; r < rows; r += CLNN_WG)
                s += CLNN_LOAD(${g}, ${g}_off + r * cols + j);
            s = clnn_wg_sum(scratch, s);
            if (lid == 0)
                CLNN_STORE(s, db, db_off + j);
        }
    }
}
</%def>
