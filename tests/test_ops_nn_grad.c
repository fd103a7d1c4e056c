/* test_ops_nn_grad.c: finite-difference gradient checks (f64) of every
 * differentiable input of the nn ops: softmax, norms, dropout, embedding,
 * conv1d/conv2d/conv_transpose2d (groups, stride, padding, dilation,
 * output_padding), poolings (padding, dilation, ceil_mode, count_include_pad),
 * sdpa (causal, grouped-query, Tq != Tk, sliding window, softcap) and rope. Shapes stay tiny: each
 * element costs two graph builds. */
#include "kn_optest.h"
#include <math.h>

typedef struct {
    int op;
    int a, b;                    /* dim / n_norm / groups / flags */
    int s[2], p[2], d[2], op2[2], k[2];
    bool flag, flag2;
} nn_case;

enum { SOFTMAX, LOG_SOFTMAX, LAYER_NORM, RMS_NORM, GROUP_NORM, BATCH_NORM, BATCH_NORM_EVAL, DROPOUT, EMBEDDING,
       CONV2D, CONV1D, CONV_T, MAX_POOL, AVG_POOL, ADAPTIVE, SDPA, ROPE };

static kn_tensor *build(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const nn_case *c = ud;
    switch (c->op) {
    case SOFTMAX: return kn_softmax(ctx, in[0], c->a);
    case LOG_SOFTMAX: return kn_log_softmax(ctx, in[0], c->a);
    case LAYER_NORM: return kn_layer_norm(ctx, in[0], c->a, c->flag ? in[1] : NULL, c->flag ? in[2] : NULL, 1e-5);
    case RMS_NORM: return kn_rms_norm(ctx, in[0], c->a, c->flag ? in[1] : NULL, 1e-6);
    case GROUP_NORM: return kn_group_norm(ctx, in[0], c->a, c->flag ? in[1] : NULL, c->flag ? in[2] : NULL, 1e-5);
    case BATCH_NORM: return kn_batch_norm(ctx, in[0], NULL, NULL, c->flag ? in[1] : NULL, c->flag ? in[2] : NULL, true, 1e-5);
    case BATCH_NORM_EVAL: return kn_batch_norm(ctx, in[0], in[3], in[4], in[1], in[2], false, 1e-5);
    case DROPOUT: return kn_dropout(ctx, in[0], 0.3, true, 99);
    case EMBEDDING: return kn_embedding(ctx, in[0], kn_cast(ctx, in[1], KN_I32));
    case CONV2D: return kn_conv2d(ctx, in[0], in[1], c->flag ? in[2] : NULL, c->s, c->p, c->d, c->a);
    case CONV1D: return kn_conv1d(ctx, in[0], in[1], c->flag ? in[2] : NULL, c->s[0], c->p[0], c->d[0], c->a);
    case CONV_T: return kn_conv_transpose2d(ctx, in[0], in[1], c->flag ? in[2] : NULL, c->s, c->p, c->op2, c->d, c->a);
    case MAX_POOL: return kn_max_pool2d(ctx, in[0], c->k, c->s, c->p, c->d, c->flag);
    case AVG_POOL: return kn_avg_pool2d(ctx, in[0], c->k, c->s, c->p, c->flag, c->flag2);
    case ADAPTIVE: return kn_adaptive_avg_pool2d(ctx, in[0], c->a, c->b);
    case SDPA: return kn_sdpa_ex(ctx, in[0], in[1], in[2], c->flag, c->a ? 0.3 : 0, c->b, c->flag2 ? 0.8 : 0);
    case ROPE: return kn_rope_ff(ctx, in[0], kn_cast(ctx, in[1], KN_I32), c->a, 100, c->flag, 0.75, c->flag2 ? in[2] : NULL);
    }
    return NULL;
}

#define IN(nd, ...) {nd, {__VA_ARGS__}, -1, 1, 0, false, false}
#define INT(nd, hi, ...) {nd, {__VA_ARGS__}, 0, hi, 0, false, true}
#define INT_(nd, ...) {nd, {__VA_ARGS__}, 0.5, 1.5, 0, false, false}   /* positive: weights, variances */
#define TR(nd, ...) {nd, {__VA_ARGS__}, -1, 1, 0, true, false}         /* a transposed (non-contiguous) view */

static double check(nn_case c, int nin, const kn_opin *in, const bool *req) {
    return kn_gradcheck(build, &c, nin, in, req);
}
#define ALL5 ((bool[]){true, true, true, true, true})
#define ONLY0 ((bool[]){true, false, false, false, false})

TEST(grad_softmax) {
    kn_test_seed(21);
    CHECK(check((nn_case){.op = SOFTMAX, .a = 1}, 1, (kn_opin[]){IN(3, 2, 3, 4)}, ALL5) < 1e-6, "softmax dim 1");
    CHECK(check((nn_case){.op = SOFTMAX, .a = 0}, 1, (kn_opin[]){TR(2, 3, 4)}, ALL5) < 1e-6, "softmax dim 0 transposed");
    CHECK(check((nn_case){.op = LOG_SOFTMAX, .a = -1}, 1, (kn_opin[]){IN(2, 3, 5)}, ALL5) < 1e-6, "log_softmax");
    CHECK(check((nn_case){.op = LOG_SOFTMAX, .a = 0}, 1, (kn_opin[]){TR(2, 4, 2)}, ALL5) < 1e-6, "log_softmax transposed");
}

TEST(grad_layer_rms_norm) {
    kn_test_seed(22);
    CHECK(check((nn_case){.op = LAYER_NORM, .a = 2, .flag = true}, 3, (kn_opin[]){IN(3, 2, 3, 4), INT_(2, 3, 4), IN(2, 3, 4)}, ALL5) < 1e-6,
          "layer_norm x, w, b");
    CHECK(check((nn_case){.op = LAYER_NORM, .a = 1}, 1, (kn_opin[]){TR(2, 3, 5)}, ALL5) < 1e-6, "layer_norm, no affine, transposed");
    CHECK(check((nn_case){.op = RMS_NORM, .a = 1, .flag = true}, 2, (kn_opin[]){IN(2, 3, 5), INT_(1, 5)}, ALL5) < 1e-6, "rms_norm x, w");
    CHECK(check((nn_case){.op = RMS_NORM, .a = 2}, 1, (kn_opin[]){IN(3, 2, 2, 3)}, ALL5) < 1e-6, "rms_norm n_norm 2");
}

TEST(grad_group_batch_norm) {
    kn_test_seed(23);
    CHECK(check((nn_case){.op = GROUP_NORM, .a = 2, .flag = true}, 3, (kn_opin[]){IN(4, 2, 4, 2, 2), INT_(1, 4), IN(1, 4)}, ALL5) < 1e-6,
          "group_norm groups 2");
    CHECK(check((nn_case){.op = GROUP_NORM, .a = 3}, 1, (kn_opin[]){TR(3, 2, 3, 4)}, ALL5) < 1e-6, "group_norm groups = C, transposed");
    CHECK(check((nn_case){.op = BATCH_NORM, .flag = true}, 3, (kn_opin[]){IN(4, 3, 2, 2, 2), INT_(1, 2), IN(1, 2)}, ALL5) < 1e-6,
          "batch_norm training 4-d");
    CHECK(check((nn_case){.op = BATCH_NORM}, 1, (kn_opin[]){TR(2, 4, 3)}, ALL5) < 1e-6, "batch_norm training [N,C]");
    CHECK(check((nn_case){.op = BATCH_NORM_EVAL}, 5, (kn_opin[]){IN(3, 2, 3, 2), INT_(1, 3), IN(1, 3), IN(1, 3), INT_(1, 3)},
                (bool[]){true, true, true, false, false}) < 1e-6, "batch_norm eval");
}

TEST(grad_dropout_embedding) {
    kn_test_seed(24);
    CHECK(check((nn_case){.op = DROPOUT}, 1, (kn_opin[]){IN(2, 6, 7)}, ALL5) < 1e-6, "dropout");
    /* 8 ids into 4 rows: repeated ids accumulate */
    CHECK(check((nn_case){.op = EMBEDDING}, 2, (kn_opin[]){IN(2, 4, 3), INT(2, 4, 2, 4)}, (bool[]){true, false}) < 1e-6, "embedding weight");
}

TEST(grad_conv2d) {
    kn_test_seed(25);
    /* groups 2, stride 2, padding 1, H such that the last rows are unused (output_padding 1 in the rule) */
    nn_case c1 = {.op = CONV2D, .a = 2, .s = {2, 2}, .p = {1, 1}, .d = {1, 1}, .flag = true};
    CHECK(check(c1, 3, (kn_opin[]){IN(4, 1, 4, 6, 5), IN(4, 4, 2, 3, 3), IN(1, 4)}, ALL5) < 1e-6, "conv2d groups 2 stride 2 pad 1");
    /* dilation, asymmetric stride/padding, transposed input */
    nn_case c2 = {.op = CONV2D, .a = 1, .s = {1, 2}, .p = {0, 1}, .d = {2, 1}, .flag = true};
    CHECK(check(c2, 3, (kn_opin[]){TR(4, 2, 2, 6, 5), IN(4, 3, 2, 2, 2), IN(1, 3)}, ALL5) < 1e-6, "conv2d dilation 2");
    /* depthwise (groups = C), stride 3 */
    nn_case c3 = {.op = CONV2D, .a = 3, .s = {3, 3}, .p = {1, 0}, .d = {1, 1}};
    CHECK(check(c3, 2, (kn_opin[]){IN(4, 1, 3, 5, 5), IN(4, 3, 1, 2, 3)}, ALL5) < 1e-6, "conv2d depthwise stride 3");
    /* conv1d via conv2d */
    nn_case c4 = {.op = CONV1D, .a = 2, .s = {2}, .p = {1}, .d = {2}, .flag = true};
    CHECK(check(c4, 3, (kn_opin[]){IN(3, 2, 2, 7), IN(3, 4, 1, 3), IN(1, 4)}, ALL5) < 1e-6, "conv1d");
}

TEST(grad_conv_transpose2d) {
    kn_test_seed(26);
    nn_case c1 = {.op = CONV_T, .a = 2, .s = {2, 2}, .p = {1, 0}, .d = {1, 1}, .op2 = {1, 1}, .flag = true};
    CHECK(check(c1, 3, (kn_opin[]){IN(4, 1, 4, 3, 3), IN(4, 4, 2, 2, 3), IN(1, 4)}, ALL5) < 1e-6, "conv_transpose2d groups 2 stride 2");
    nn_case c2 = {.op = CONV_T, .a = 1, .s = {1, 2}, .p = {1, 1}, .d = {2, 1}, .op2 = {0, 1}};
    CHECK(check(c2, 2, (kn_opin[]){TR(4, 2, 2, 3, 2), IN(4, 2, 3, 3, 2)}, ALL5) < 1e-6, "conv_transpose2d dilation 2");
    /* output_padding >= stride (allowed because < dilation): the input gradient is narrowed */
    nn_case c3 = {.op = CONV_T, .a = 1, .s = {1, 1}, .p = {1, 1}, .d = {2, 2}, .op2 = {1, 1}, .flag = true};
    CHECK(check(c3, 3, (kn_opin[]){IN(4, 1, 2, 3, 3), IN(4, 2, 2, 2, 2), IN(1, 2)}, ALL5) < 1e-6, "conv_transpose2d output_padding 1 stride 1");
}

TEST(grad_pools) {
    kn_test_seed(27);
    nn_case m1 = {.op = MAX_POOL, .k = {3, 3}, .s = {2, 2}, .p = {1, 1}, .d = {1, 1}, .flag = true};
    CHECK(check(m1, 1, (kn_opin[]){IN(4, 1, 2, 6, 5)}, ALL5) < 1e-6, "max_pool ceil_mode pad 1");
    nn_case m2 = {.op = MAX_POOL, .k = {2, 2}, .s = {1, 2}, .p = {0, 1}, .d = {2, 1}};
    CHECK(check(m2, 1, (kn_opin[]){TR(3, 2, 5, 5)}, ALL5) < 1e-6, "max_pool dilation, overlapping, transposed");
    nn_case a1 = {.op = AVG_POOL, .k = {3, 2}, .s = {2, 2}, .p = {1, 1}, .flag = true, .flag2 = true};
    CHECK(check(a1, 1, (kn_opin[]){IN(4, 1, 2, 6, 5)}, ALL5) < 1e-6, "avg_pool ceil, count_include_pad");
    nn_case a2 = {.op = AVG_POOL, .k = {3, 3}, .s = {1, 2}, .p = {1, 1}, .flag = false, .flag2 = false};
    CHECK(check(a2, 1, (kn_opin[]){TR(4, 1, 2, 4, 5)}, ALL5) < 1e-6, "avg_pool exclude pad, transposed");
    CHECK(check((nn_case){.op = ADAPTIVE, .a = 3, .b = 4}, 1, (kn_opin[]){IN(4, 1, 2, 5, 7)}, ALL5) < 1e-6, "adaptive 5x7 -> 3x4");
    CHECK(check((nn_case){.op = ADAPTIVE, .a = 4, .b = 2}, 1, (kn_opin[]){IN(3, 2, 3, 4)}, ALL5) < 1e-6, "adaptive upsampling rows");
}

TEST(grad_sdpa) {
    kn_test_seed(28);
    CHECK(check((nn_case){.op = SDPA, .flag = true}, 3,
                (kn_opin[]){IN(4, 1, 4, 3, 3), IN(4, 1, 2, 4, 3), IN(4, 1, 2, 4, 2)}, ALL5) < 1e-6, "causal GQA, Tq < Tk, Dv != D");
    CHECK(check((nn_case){.op = SDPA, .a = 1}, 3,
                (kn_opin[]){IN(4, 2, 2, 3, 2), TR(4, 2, 2, 3, 2), IN(4, 2, 2, 3, 2)}, ALL5) < 1e-6, "plain, explicit scale, transposed k");
    CHECK(check((nn_case){.op = SDPA, .flag = true}, 3,
                (kn_opin[]){IN(4, 1, 3, 4, 2), IN(4, 1, 1, 4, 2), IN(4, 1, 1, 4, 2)}, ALL5) < 1e-6, "causal multi-query");
    CHECK(check((nn_case){.op = SDPA, .flag = true, .b = 2}, 3,
                (kn_opin[]){IN(4, 1, 2, 5, 3), IN(4, 1, 1, 6, 3), IN(4, 1, 1, 6, 2)}, ALL5) < 1e-6, "sliding window 2, Tq < Tk");
    CHECK(check((nn_case){.op = SDPA, .flag = true, .flag2 = true, .a = 1}, 3,
                (kn_opin[]){IN(4, 1, 2, 4, 3), TR(4, 1, 2, 4, 3), IN(4, 1, 2, 4, 3)}, ALL5) < 1e-6, "softcap, transposed k");
    CHECK(check((nn_case){.op = SDPA, .flag = true, .flag2 = true, .b = 3}, 3,
                (kn_opin[]){IN(4, 1, 4, 5, 2), IN(4, 1, 2, 5, 2), IN(4, 1, 2, 5, 2)}, ALL5) < 1e-6, "window 3 and softcap, GQA");
}

TEST(grad_rope) {
    kn_test_seed(29);
    for (int neox = 0; neox < 2; neox++) {
        CHECK(check((nn_case){.op = ROPE, .a = 4, .flag = neox}, 2, (kn_opin[]){IN(3, 2, 3, 6), INT(1, 40, 3)}, (bool[]){true, false}) < 1e-6,
              "rope neox %d partial", neox);
        CHECK(check((nn_case){.op = ROPE, .a = 4, .flag = neox}, 2, (kn_opin[]){TR(3, 2, 3, 4), INT(1, 40, 3)}, (bool[]){true, false}) < 1e-6,
              "rope neox %d transposed", neox);
        CHECK(check((nn_case){.op = ROPE, .a = 4, .flag = neox, .flag2 = true}, 3,
                    (kn_opin[]){IN(3, 2, 3, 6), INT(1, 40, 3), INT_(1, 2)}, (bool[]){true, false, false}) < 1e-6,
              "rope neox %d with freq factors", neox);
    }
}

KN_TEST_MAIN()
