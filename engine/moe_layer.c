/*
 * moe_layer.c — a MoE layer through the dispatch/combine seam (see
 * moe_layer.h). Served path: every rank of a placement played in this
 * process by the backend's gather — slots laid out by moeq_ep_layout, grouped
 * by (rank, local expert) as each rank would receive them — and combined
 * straight from the expert rows through the slot map; the engine runs the
 * identity placement of one rank, tests others
 * (moeq_moe_layer_set_placement). Handle path (set_placement NULL): the ep/
 * handle's local transport (dispatch groups every slot's row by local
 * expert, combine hands the rows back per slot: two copies), the exchange a
 * multi-rank group will run.
 *
 * Either way each expert GEMM's rows are other rows than before, which (the
 * kernels being batch invariant) changes no row, and each token's sum is
 * formed once, in slot order, by the backend's combine.
 *
 * The ep handle's buffers are host memory (moeq/ep.h); a device backend will
 * pass device pointers through its nccl/ucx transport.
 */
#include "moe_layer.h"

#include <stdlib.h>
#include <string.h>

#include "moeq/ep.h"
#include "tensor.h"

/* The layer's number in messages: main layers 0.., MTP layers after them. */
static int layer_number(const moeq_engine *e, const moeq_layer *L) {
    const moeq_model *m = e->model;
    int n_main = e->cfg->num_hidden_layers;
    for (int i = 0; i < m->n_mtp_layers; i++)
        if (L == &m->mtp_layers[i]) return n_main + i;
    if (L == e->mtp_f8_layer) return n_main; /* MTP layer 0's copy with F8 weights (mtp_draft = f8) */
    return (int)(L - m->layers);
}

/* Each sequence remembers the first layer whose router saw a non-finite score (numerical_error names it). */
static void flag_nonfinite(moeq_engine *e, const moeq_layer *L, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++) {
        int *first = &e->nonfinite_layer[e->s.tok_seq[t]];
        if (!e->s.finite[t] && *first < 0) *first = layer_number(e, L);
    }
}

struct moeq_moe_layer;
static void count_slots(moeq_engine *e, const moeq_layer *L, int64_t n_tok);

struct moeq_moe_layer {
    moeq_ep *ep;                 /* the handle: local (made when a test asks for it) or the group's */
    int borrowed;                /* ep is the group's (moeq_moe_layer_join): not destroyed here */
    moeq_ep_params ep_params;
    /* a group's expert rows: up to n_ranks * max_tokens * top_k arrive, more than the step arena holds */
    float *gg, *gu, *gdown;      /* backend arena buffers, (cap_rows + max_tokens) rows; NULL on one rank */
    int64_t cap_rows;
    moeq_err failed;             /* first exchange error (cannot happen on local) */
    int64_t one_part[2];         /* {0, n_local}                              */
    char why[160];
    /* tests: every rank of `sim` in this process */
    moeq_ep_placement *sim;
    int32_t *dest_rank, *dest_local; /* (max_slots)                             */
    int64_t *count;                  /* (n_ranks)                               */
    int64_t *group_first;            /* (n_ranks + 1) first group of each rank  */
    int64_t *group_offset;           /* (n_groups + 1) rows of each group        */
    int *group_expert;               /* (n_groups) global expert of each group   */
    int64_t *order;                  /* (max_slots) slots grouped                */
    int64_t max_slots;
    const float **slot_ptr;      /* (max_slots) combine rows through the handle, where the transport left them */
    /* routed slots per (layer, expert) since creation: main layers, then MTP layers (layer_number) */
    uint64_t *slots;
    int n_count_layers;
    /* the moe_experts path (one rank, the identity placement, a backend that has the op): nothing comes back
     * inside a layer. Its counts add up in backend memory (downloaded when asked), its router flags stay in
     * backend memory until the pass ends (moeq_moe_layer_flush: one download per pass). */
    int identity;                /* sim is the engine's own one-rank identity placement */
    uint64_t *dstats;            /* backend (n_count_layers, E) the op's counts */
    uint64_t *counts_out;        /* host: slots + dstats, what moeq_moe_layer_counts returns */
    uint8_t *dfinite;            /* backend (n_count_layers, max_tokens) the router's flags of this pass */
    uint8_t *hfinite;            /* host twin of dfinite */
    uint8_t *ran;                /* host (n_count_layers): layer routed on the backend since the last flush */
    int ran_lo, ran_hi;          /* their range, ran_lo > ran_hi: none */
    int64_t ran_tok;             /* the pass's tokens */
    /* the main layers' routed experts the backend holds (moeq_moe_layer_map) */
    int mapped;                  /* 0: expert_weights = group, and neither a join nor a step has mapped them */
    uint8_t *resident;           /* (num_hidden_layers, E) flags; NULL: every one (once mapped) */
    int rank;                    /* this rank of the group (joined) */
};

/* Where the rows of one exchange sit: groups of rows, each for one expert; groups by rank (parts). */
typedef struct moe_rows {
    const float *x;          /* (n_rows, D)                                            */
    int64_t n_rows;          /* routed rows; the shared expert's T rows follow them in g, u, down */
    float *g, *u, *down;     /* expert outputs: the step arena, or the group's buffers  */
    int n_parts;             /* ranks whose experts run here: 1, or all in the test path */
    const int64_t *part;     /* (n_parts + 1) first group of each part                  */
    const int *expert;       /* (n_groups) global expert of each group                  */
    const int64_t *offset;   /* (n_groups + 1) first row of each group                  */
} moe_rows;

/*
 * One rank (the engine today): the layout of the identity placement played in
 * place — the backend gathers each slot's row into its expert's group and the
 * combine reads the expert rows through the slot map. That is the local
 * transport's result (per-slot rows, summed in slot order) without its two
 * copies of every slot's row, which cost ~8 % of a 512-token prefill
 * (bench-engine); the handle serves ranks > 1 and the test that checks that
 * both paths give the same bits.
 */
static moeq_err sim_set(moeq_moe_layer *m, int n_experts, const moeq_ep_placement *pl, char *errstr,
                        size_t errstr_size);

/* The moe_experts path's buffers: counts (zeroed: slots is calloc'd and of the same size) and flags. */
static moeq_err op_buffers(moeq_engine *e, moeq_moe_layer *m, char *errstr, size_t errstr_size) {
    moeq_backend *b = e->backend;
    size_t nc = (size_t)m->n_count_layers * (size_t)e->cfg->n_routed_experts;
    size_t nf = (size_t)m->n_count_layers * (size_t)m->ep_params.max_tokens;
    m->ran_lo = m->n_count_layers, m->ran_hi = -1;
    m->counts_out = malloc(nc * sizeof(uint64_t));
    m->hfinite = malloc(nf);
    m->ran = calloc((size_t)m->n_count_layers, 1);
    if (!m->counts_out || !m->hfinite || !m->ran ||
        !(m->dstats = b->alloc(b, MOEQ_BUFFER_STATE, nc * sizeof(uint64_t))) ||
        !(m->dfinite = b->alloc(b, MOEQ_BUFFER_STATE, nf)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "moe layer: expert counts and router flags");
    b->upload(b, m->dstats, m->slots, nc * sizeof(uint64_t));
    return MOEQ_OK;
}

moeq_err moeq_moe_layer_new(moeq_engine *e, moeq_moe_layer **out, char *errstr, size_t errstr_size) {
    *out = NULL;
    const moeq_model_config *c = e->cfg;
    if (c->n_routed_experts <= 0) return MOEQ_OK;
    moeq_moe_layer *m = calloc(1, sizeof(*m));
    if (!m) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "moe layer");
    moeq_ep_params p = moeq_ep_default_params(); /* transport local, one rank, f32 rows */
    p.n_experts = c->n_routed_experts;
    p.hidden = c->hidden_size;
    p.max_tokens = e->params.max_step_tokens;
    p.top_k = c->num_experts_per_tok;
    m->ep_params = p;
    m->max_slots = (int64_t)p.max_tokens * p.top_k;
    m->n_count_layers = c->num_hidden_layers + e->model->n_mtp_layers;
    m->slots = calloc((size_t)m->n_count_layers * (size_t)c->n_routed_experts, sizeof(uint64_t));
    m->slot_ptr = malloc((size_t)m->max_slots * sizeof(*m->slot_ptr));
    if (!m->slots || !m->slot_ptr) {
        free(m->slots), free((void *)m->slot_ptr);
        free(m);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "moe layer: expert counts");
    }
    moeq_ep_placement *id = NULL;
    moeq_err err = moeq_ep_placement_new_identity(c->n_routed_experts, 1, &id, errstr, errstr_size);
    if (!err) err = sim_set(m, c->n_routed_experts, id, errstr, errstr_size);
    moeq_ep_placement_destroy(id);
    if (!err) err = op_buffers(e, m, errstr, errstr_size);
    if (err) {
        moeq_moe_layer_destroy(m, e->backend);
        return err;
    }
    m->identity = 1;
    m->mapped = strcmp(e->params.expert_weights, "group") != 0; /* "all": map_weights mapped them */
    *out = m;
    return MOEQ_OK;
}

static void free_sim(moeq_moe_layer *m) {
    moeq_ep_placement_destroy(m->sim);
    free(m->dest_rank), free(m->dest_local), free(m->count), free(m->group_first), free(m->group_offset);
    free(m->group_expert), free(m->order);
    m->sim = NULL;
    m->dest_rank = m->dest_local = NULL, m->count = m->group_first = m->group_offset = m->order = NULL;
    m->group_expert = NULL;
}

void moeq_moe_layer_destroy(moeq_moe_layer *m, moeq_backend *b) {
    if (!m) return;
    if (!m->borrowed) moeq_ep_destroy(m->ep);
    if (b) b->release(b, m->gg), b->release(b, m->gu), b->release(b, m->gdown);
    if (b) b->release(b, m->dstats), b->release(b, m->dfinite);
    free(m->counts_out), free(m->hfinite), free(m->ran);
    free_sim(m);
    free(m->slots);
    free(m->resident);
    free((void *)m->slot_ptr);
    free(m);
}

/* Play every rank of pl in this process (pl is copied). */
static moeq_err sim_set(moeq_moe_layer *m, int n_experts, const moeq_ep_placement *pl, char *errstr,
                        size_t errstr_size) {
    free_sim(m);
    if (moeq_ep_placement_n_experts(pl) != n_experts)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "placement of %d experts, the model has %d",
                         moeq_ep_placement_n_experts(pl), n_experts);
    int R = moeq_ep_placement_n_ranks(pl);
    int64_t groups = 0;
    for (int r = 0; r < R; r++) groups += moeq_ep_placement_n_local(pl, r);
    if (moeq_ep_placement_clone(pl, &m->sim)) return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "placement");
    m->dest_rank = malloc((size_t)m->max_slots * sizeof(int32_t));
    m->dest_local = malloc((size_t)m->max_slots * sizeof(int32_t));
    m->order = malloc((size_t)m->max_slots * sizeof(int64_t));
    m->count = malloc((size_t)R * sizeof(int64_t));
    m->group_first = malloc((size_t)(R + 1) * sizeof(int64_t));
    m->group_offset = malloc((size_t)(groups + 1) * sizeof(int64_t));
    m->group_expert = malloc((size_t)(groups > 0 ? groups : 1) * sizeof(int));
    if (!m->dest_rank || !m->dest_local || !m->order || !m->count || !m->group_first || !m->group_offset ||
        !m->group_expert) {
        free_sim(m);
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "placement of %d ranks", R);
    }
    m->group_first[0] = 0;
    for (int r = 0; r < R; r++) {
        int n = moeq_ep_placement_n_local(pl, r);
        for (int l = 0; l < n; l++) m->group_expert[m->group_first[r] + l] = moeq_ep_placement_local_expert(pl, r, l);
        m->group_first[r + 1] = m->group_first[r] + n;
    }
    return MOEQ_OK;
}

moeq_err moeq_moe_layer_set_placement(moeq_engine *e, const moeq_ep_placement *pl, char *errstr, size_t errstr_size) {
    moeq_moe_layer *m = e->moe;
    if (!m) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "the model has no routed experts");
    if (m->borrowed)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "the engine is a rank of a group: its placement is the group's");
    m->identity = 0; /* a test's placement (or the handle) runs the composed path it checks */
    if (pl) return sim_set(m, e->cfg->n_routed_experts, pl, errstr, errstr_size);
    free_sim(m);
    return m->ep ? MOEQ_OK : moeq_ep_new(&m->ep_params, NULL, NULL, &m->ep, errstr, errstr_size);
}

/*
 * Every rank of the placement at once: slot s goes to group (dest_rank,
 * dest_local); within a group slots ascend, as a rank receives them from one
 * source. The backend gathers the rows and keeps the slot map for combine.
 */
static moe_rows sim_dispatch(moeq_engine *e, int64_t T) {
    moeq_moe_layer *m = e->moe;
    moeq_scratch *s = &e->s;
    int64_t K = e->router.top_k, S = T * K, D = e->cfg->hidden_size;
    int R = moeq_ep_placement_n_ranks(m->sim);
    int64_t G = m->group_first[R];
    /* ids come from the router: always valid, so the layout cannot fail */
    (void)moeq_ep_layout(m->sim, 0, T, (int)K, s->rids, m->dest_rank, m->dest_local, m->count, NULL, 0);
    for (int64_t g = 0; g <= G; g++) m->group_offset[g] = 0;
    for (int64_t i = 0; i < S; i++) m->group_offset[m->group_first[m->dest_rank[i]] + m->dest_local[i] + 1]++;
    for (int64_t g = 0; g < G; g++) m->group_offset[g + 1] += m->group_offset[g];
    for (int64_t i = 0; i < S; i++) {
        int64_t g = m->group_first[m->dest_rank[i]] + m->dest_local[i];
        m->order[m->group_offset[g]++] = i; /* the offsets advance as cursors; shifted back below */
    }
    for (int64_t g = G; g > 0; g--) m->group_offset[g] = m->group_offset[g - 1]; /* undo the fill's advance */
    m->group_offset[0] = 0;
    moeq_gather_params gp = {s->xg, s->slot_row, s->h, m->order, S, K, D};
    e->backend->gather(e->backend, &gp);
    return (moe_rows){s->xg, S, s->g, s->u, s->down, R, m->group_first, m->group_expert, m->group_offset};
}

/*
 * Through the handle (local transport, or the group's): rows grouped by local expert, held by the handle
 * until the next dispatch. A failed exchange runs no expert (its step's results are void).
 */
static moe_rows ep_dispatch(moeq_engine *e, int64_t T) {
    moeq_moe_layer *m = e->moe;
    moeq_scratch *s = &e->s;
    moeq_ep_recv r = {0};
    moeq_err err = m->failed ? m->failed : moeq_ep_dispatch(m->ep, T, s->rids, s->h, &r, m->why, sizeof(m->why));
    if (err && !m->failed) m->failed = err;
    m->one_part[0] = 0;
    m->one_part[1] = err ? 0 : r.n_local;
    moe_rows rows = {err ? s->h : r.x, err ? 0 : r.n_rows, s->g, s->u, s->down, 1, m->one_part, r.local_expert,
                     r.expert_offset};
    if (m->gg) rows.g = m->gg, rows.u = m->gu, rows.down = m->gdown;
    return rows;
}

/*
 * The load each expert sees: every routed slot of this rank's tokens, counted
 * on the token's rank (a group's ranks count disjoint tokens, so their sums
 * add up). Host ids, after the router: no effect on any result.
 */
static void count_slots(moeq_engine *e, const moeq_layer *L, int64_t T) {
    moeq_moe_layer *m = e->moe;
    int E = e->cfg->n_routed_experts;
    uint64_t *row = m->slots + (size_t)layer_number(e, L) * (size_t)E;
    for (int64_t i = 0; i < T * e->router.top_k; i++) {
        int32_t x = e->s.rids[i];
        if (x >= 0 && x < E) row[x]++;
    }
}

/* A device's: the host path's counts plus the op's, brought from backend memory now (no step waits for them). */
const uint64_t *moeq_moe_layer_counts(const moeq_engine *e, int *n_layers) {
    moeq_moe_layer *m = e->moe;
    *n_layers = m ? m->n_count_layers : 0;
    if (!m) return NULL;
    if (e->backend->host_visible) return m->slots; /* the op counts into it directly: a live table */
    size_t nc = (size_t)m->n_count_layers * (size_t)e->cfg->n_routed_experts;
    e->backend->download(e->backend, m->counts_out, m->dstats, nc * sizeof(uint64_t));
    for (size_t i = 0; i < nc; i++) m->counts_out[i] += m->slots[i];
    return m->counts_out;
}

/* The layers routed on the backend since the last flush: their flags come back in one download. */
void moeq_moe_layer_flush(moeq_engine *e) {
    moeq_moe_layer *m = e->moe;
    if (!m || m->ran_lo > m->ran_hi) return;
    int64_t MT = m->ep_params.max_tokens, T = m->ran_tok;
    size_t off = (size_t)m->ran_lo * (size_t)MT, len = (size_t)(m->ran_hi - m->ran_lo) * (size_t)MT + (size_t)T;
    const uint8_t *fin = m->dfinite; /* a host backend's memory is read in place: nothing to copy */
    if (!e->backend->host_visible) e->backend->download(e->backend, m->hfinite + off, m->dfinite + off, len);
    if (!e->backend->host_visible) fin = m->hfinite;
    for (int l = m->ran_lo; l <= m->ran_hi; l++) {
        if (!m->ran[l]) continue;
        m->ran[l] = 0;
        for (int64_t t = 0; t < T; t++) {
            int *first = &e->nonfinite_layer[e->s.tok_seq[t]];
            if (!fin[(size_t)l * (size_t)MT + (size_t)t] && *first < 0) *first = l;
        }
    }
    m->ran_lo = m->n_count_layers, m->ran_hi = -1;
}

void moeq_moe_layer_set_valid(moeq_engine *e, int64_t n_valid) {
    moeq_moe_layer *m = e->moe;
    if (m && n_valid < m->ran_tok) m->ran_tok = n_valid;
}

/* Whether layer L runs through the backend's moe_experts op: one rank's own placement, and the op there. */
static int use_op(const moeq_engine *e, const moeq_layer *L, int local) {
    const moeq_moe_layer *m = e->moe;
    const moeq_backend *b = e->backend;
    return local && m->identity && b->moe_experts && L->experts &&
           b->supports(b, MOEQ_BACKEND_OP_MOE_EXPERTS, L->experts[0].gate_proj->dtype);
}

/* Router and experts on the backend: ids, flags and counts stay there (no wait inside the layer). */
static void run_op(moeq_engine *e, const moeq_layer *L, const moeq_layer_vecs *v, int64_t T) {
    moeq_moe_layer *m = e->moe;
    moeq_scratch *s = &e->s;
    int64_t K = e->router.top_k, D = e->cfg->hidden_size;
    int E = e->cfg->n_routed_experts, l = layer_number(e, L);
    if (T <= 0) return;
    moeq_mm_job r = {L->gate, 0, moeq_tensor_rows(L->gate), s->h, D, s->router, moeq_tensor_rows(L->gate), T};
    e->backend->matmul(e->backend, &r, 1);
    uint8_t *fin = m->dfinite + (size_t)l * (size_t)m->ep_params.max_tokens;
    moeq_route_params rp = {&e->router, T, s->router, v->bias, s->dids, s->rw, fin, s->route_scratch, NULL, NULL, 1};
    e->backend->route(e->backend, &rp);
    moeq_moe_experts_params xp = {L->experts, &L->shared, E, T, K, D, e->cfg->moe_intermediate_size, s->h, s->dids,
                                  s->rw, s->tmp, s->xg, s->g, s->u, s->down, s->slot_row, s->moe_plan,
                                  (e->backend->host_visible ? m->slots : m->dstats) + (size_t)l * (size_t)E,
                                  m->ep_params.max_tokens};
    e->backend->moe_experts(e->backend, &xp);
    m->ran[l] = 1;
    m->ran_lo = l < m->ran_lo ? l : m->ran_lo;
    m->ran_hi = l > m->ran_hi ? l : m->ran_hi;
    m->ran_tok = T;
}

/* Gate and up of the groups [g0, g1) (one rank's experts) from job n on; returns the jobs laid out. */
static int gate_up_jobs(moeq_engine *e, const moeq_layer *L, const moe_rows *rows, int64_t g0, int64_t g1, int n) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, MI = e->cfg->moe_intermediate_size;
    for (int64_t g = g0; g < g1; g++) {
        int64_t o = rows->offset[g], cnt = rows->offset[g + 1] - o;
        const moeq_expert *x = &L->experts[rows->expert[g]];
        if (!cnt) continue;
        s->jobs[n++] = (moeq_mm_job){x->gate_proj, 0, MI, rows->x + o * D, D, rows->g + o * MI, MI, cnt};
        s->jobs[n++] = (moeq_mm_job){x->up_proj, 0, MI, rows->x + o * D, D, rows->u + o * MI, MI, cnt};
    }
    return n;
}

static int down_jobs(moeq_engine *e, const moeq_layer *L, const moe_rows *rows, int64_t g0, int64_t g1, int n) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, MI = e->cfg->moe_intermediate_size;
    for (int64_t g = g0; g < g1; g++) {
        int64_t o = rows->offset[g], cnt = rows->offset[g + 1] - o;
        if (cnt)
            s->jobs[n++] = (moeq_mm_job){L->experts[rows->expert[g]].down_proj, 0, D, rows->g + o * MI, MI,
                                         rows->down + o * D, D, cnt};
    }
    return n;
}

/* A rank runs only the experts it holds: one it does not would read weights the backend gave back (a device
 * backend fails naming the tensor; the CPU would page them in again). A placement bug, named before any job. */
static void check_resident(moeq_engine *e, const moeq_layer *L, const moe_rows *rows) {
    moeq_moe_layer *m = e->moe;
    int l = layer_number(e, L), E = e->cfg->n_routed_experts;
    for (int64_t g = 0; m->resident && g < rows->part[rows->n_parts]; g++) {
        int x = rows->expert[g];
        if (rows->offset[g + 1] > rows->offset[g] && !m->resident[(size_t)l * (size_t)E + (size_t)x]) {
            m->failed = MOEQ_ERR_INTERNAL;
            snprintf(m->why, sizeof m->why, "rank %d was given rows of expert %d of layer %d, which it does not "
                     "hold (a placement bug)", m->rank, x, l);
            return;
        }
    }
}

/*
 * One GEMM per group with rows (gate+up, then down) and the shared expert over all tokens: one dispatch per
 * rank's experts and step (on one rank: two dispatches in all, as before the seam).
 */
static void run_experts(moeq_engine *e, const moeq_layer *L, const moe_rows *rows, int64_t T) {
    moeq_scratch *s = &e->s;
    int64_t D = e->cfg->hidden_size, N = rows->n_rows;
    int64_t MI = e->cfg->moe_intermediate_size;
    int64_t SI = L->shared.gate_proj && T ? moeq_tensor_rows(L->shared.gate_proj) : 0; /* none in an empty step */
    float *sg = rows->g + N * MI, *su = rows->u + N * MI;
    for (int p = 0; p < rows->n_parts; p++) {
        int n = gate_up_jobs(e, L, rows, rows->part[p], rows->part[p + 1], 0);
        if (SI && p == 0) {
            s->jobs[n++] = (moeq_mm_job){L->shared.gate_proj, 0, SI, s->h, D, sg, SI, T};
            s->jobs[n++] = (moeq_mm_job){L->shared.up_proj, 0, SI, s->h, D, su, SI, T};
        }
        if (n) e->backend->matmul(e->backend, s->jobs, n);
    }
    if (N * MI + T * SI) e->backend->silu_mul(e->backend, rows->g, rows->g, rows->u, N * MI + T * SI);
    for (int p = 0; p < rows->n_parts; p++) {
        int n = down_jobs(e, L, rows, rows->part[p], rows->part[p + 1], 0);
        if (SI && p == 0) s->jobs[n++] = (moeq_mm_job){L->shared.down_proj, 0, D, sg, SI, rows->down + N * D, D, T};
        if (n) e->backend->matmul(e->backend, s->jobs, n);
    }
}

void moeq_moe_layer_run(moeq_engine *e, const moeq_layer *L, const moeq_layer_vecs *v, int64_t T) {
    moeq_moe_layer *m = e->moe;
    moeq_scratch *s = &e->s;
    int64_t K = e->router.top_k, D = e->cfg->hidden_size;
    /* MTP layers stay on the rank in a group: every rank holds their experts, so a draft exchanges nothing */
    int local = m->sim && (!m->borrowed || layer_number(e, L) >= e->cfg->num_hidden_layers);
    if (use_op(e, L, local)) {
        run_op(e, L, v, T);
        return;
    }
    if (T > 0) { /* an empty step (a rank of a group with nothing to run) only serves the others' rows */
        moeq_mm_job r = {L->gate, 0, moeq_tensor_rows(L->gate), s->h, D, s->router, moeq_tensor_rows(L->gate), T};
        e->backend->matmul(e->backend, &r, 1);
        moeq_route_params rp = {&e->router, T, s->router, v->bias, s->rids, s->rw, s->finite, s->route_scratch,
                                NULL, NULL, 0}; /* no plan: the dispatch groups the rows */
        e->backend->route(e->backend, &rp);
        flag_nonfinite(e, L, T);
        count_slots(e, L, T);
    }
    moe_rows rows = local ? sim_dispatch(e, T) : ep_dispatch(e, T);
    if (!local && !m->failed) check_resident(e, L, &rows);
    run_experts(e, L, &rows, T);
    const float *shared = L->shared.gate_proj ? rows.down + rows.n_rows * D : NULL;
    if (local) { /* rows stay where the experts wrote them; the gather's slot map finds them */
        moeq_combine_params cp = {s->tmp, s->down, s->slot_row, s->rw, shared, T, K, D, NULL};
        e->backend->combine(e->backend, &cp);
        return;
    }
    /* per-slot rows: on a host backend read where the transport left them, else copied out to (T, K, D) */
    int by_ptr = e->backend->host_visible;
    moeq_err err = m->failed       ? m->failed
                   : by_ptr        ? moeq_ep_combine_rows(m->ep, rows.down, m->slot_ptr, m->why, sizeof(m->why))
                                   : moeq_ep_combine(m->ep, rows.down, s->xg, m->why, sizeof(m->why));
    if (err && !m->failed) m->failed = err;
    if (T == 0 || err) return; /* a failed exchange: the step's results are void */
    moeq_combine_params cp = {s->tmp, s->xg, NULL, s->rw, shared, T, K, D, by_ptr ? m->slot_ptr : NULL};
    e->backend->combine(e->backend, &cp);
}

/* Every MoE layer's exchange with zero tokens, in the forward's order (main layers; MTP is off in a group). */
void moeq_moe_layer_run_empty(moeq_engine *e) {
    for (int l = 0; l < e->cfg->num_hidden_layers; l++)
        if (e->model->layers[l].is_moe) moeq_moe_layer_run(e, &e->model->layers[l], &e->vecs[l], 0);
}

int moeq_moe_layer_in_group(const moeq_engine *e) { return e->moe && e->moe->borrowed; }

moeq_err moeq_moe_layer_map(moeq_engine *e, const moeq_ep_placement *pl, int rank, char *errstr,
                            size_t errstr_size) {
    moeq_moe_layer *m = e->moe;
    if (!m) return MOEQ_OK;
    int n_main = e->cfg->num_hidden_layers, E = e->cfg->n_routed_experts;
    uint8_t *resident = NULL;
    if (pl) {
        if (!(resident = calloc((size_t)n_main * (size_t)E, 1)))
            return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "expert residency flags");
        for (int x = 0; x < E; x++)
            for (int i = 0; i < moeq_ep_placement_n_replicas(pl, x); i++)
                if (moeq_ep_placement_replica(pl, x, i) == rank)
                    for (int l = 0; l < n_main; l++) resident[(size_t)l * (size_t)E + (size_t)x] = 1;
    }
    moeq_backend *b = e->backend;
    char why[384] = "";
    moeq_err err = b->map_experts ? b->map_experts(b, e->model, resident, why, sizeof why) : MOEQ_OK;
    if (err) {
        free(resident);
        m->mapped = 0; /* what the backend holds is unknown: the next step maps them all again */
        return moeq_errf(err, errstr, errstr_size, "mapping %s routed experts: %s", pl ? "this rank's" : "every",
                         why);
    }
    free(m->resident);
    m->resident = resident;
    m->mapped = 1;
    return MOEQ_OK;
}

int moeq_moe_layer_mapped(const moeq_engine *e) { return !e->moe || e->moe->mapped; }

void moeq_moe_layer_residency(const moeq_engine *e, int64_t *held, int64_t *total, size_t *bytes) {
    const moeq_moe_layer *m = e->moe;
    *held = *total = 0, *bytes = 0;
    if (!m) return;
    int E = e->cfg->n_routed_experts;
    for (int l = 0; l < e->cfg->num_hidden_layers; l++) {
        const moeq_layer *L = &e->model->layers[l];
        for (int x = 0; L->experts && x < E; x++) {
            ++*total;
            if (!m->mapped || (m->resident && !m->resident[(size_t)l * (size_t)E + (size_t)x])) continue;
            ++*held;
            const moeq_tensor *w[3] = {L->experts[x].gate_proj, L->experts[x].up_proj, L->experts[x].down_proj};
            for (int i = 0; i < 3; i++)
                if (w[i]) *bytes += w[i]->nbytes + (w[i]->scale_inv ? w[i]->scale_inv->nbytes : 0);
        }
    }
}

moeq_err moeq_moe_layer_join(moeq_engine *e, moeq_ep *ep, int rank, int n_ranks, char *errstr, size_t errstr_size) {
    moeq_moe_layer *m = e->moe;
    if (!m) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "the model has no routed experts");
    if (m->borrowed) return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size, "the engine is in a group already");
    const moeq_ep_placement *pl = moeq_ep_placement_of(ep);
    if (moeq_ep_placement_n_experts(pl) != e->cfg->n_routed_experts || moeq_ep_placement_n_ranks(pl) != n_ranks)
        return moeq_errf(MOEQ_ERR_INVALID_ARG, errstr, errstr_size,
                         "group placement of %d experts over %d ranks; the model has %d experts, the group %d ranks",
                         moeq_ep_placement_n_experts(pl), moeq_ep_placement_n_ranks(pl), e->cfg->n_routed_experts,
                         n_ranks);
    int64_t K = m->ep_params.top_k, T = m->ep_params.max_tokens, D = e->cfg->hidden_size;
    int64_t MI = e->cfg->moe_intermediate_size, SI = (int64_t)e->cfg->n_shared_experts * MI;
    m->cap_rows = (int64_t)n_ranks * T * K;
    size_t gu = (size_t)(m->cap_rows * MI + T * SI) * sizeof(float);
    size_t dn = (size_t)((m->cap_rows + T) * D) * sizeof(float);
    moeq_backend *b = e->backend;
    if (!(m->gg = b->alloc(b, MOEQ_BUFFER_ARENA, gu)) || !(m->gu = b->alloc(b, MOEQ_BUFFER_ARENA, gu)) ||
        !(m->gdown = b->alloc(b, MOEQ_BUFFER_ARENA, dn)))
        return moeq_errf(MOEQ_ERR_NOMEM, errstr, errstr_size, "expert rows of a %d-rank group (%lld rows)", n_ranks,
                         (long long)m->cap_rows);
    /* the one-rank identity layout stays for the MTP layers (rank-local; a test's placement is dropped) */
    moeq_ep_placement *id = NULL;
    moeq_err err = moeq_ep_placement_new_identity(e->cfg->n_routed_experts, 1, &id, errstr, errstr_size);
    if (!err) err = sim_set(m, e->cfg->n_routed_experts, id, errstr, errstr_size);
    moeq_ep_placement_destroy(id);
    if (err) return err;
    m->identity = 1; /* the MTP layers' own one-rank placement */
    if (!e->model->n_mtp_layers) free_sim(m);
    moeq_ep_destroy(m->ep);
    m->ep = ep;
    m->borrowed = 1;
    m->rank = rank;
    return moeq_moe_layer_map(e, pl, rank, errstr, errstr_size);
}

moeq_err moeq_moe_layer_status(const moeq_engine *e, char *errstr, size_t errstr_size) {
    const moeq_moe_layer *m = e->moe;
    if (!m || !m->failed) return MOEQ_OK;
    return moeq_errf(m->failed, errstr, errstr_size, "moe layer exchange: %s", m->why);
}
