/* test_formats.c: model file readers and writers: GGUF, safetensors, JSON,
 * llama2.c checkpoints, llm.c GPT-2 checkpoints, file mapping.
 *
 * Real assets when present (SKIP otherwise), round trips of the writers, and
 * tables of corrupted inputs built in memory from a small valid file built
 * here: every one must fail with a status and a message, never crash or leak
 * (CI runs this under ASan + UBSan). */
#include "kn_test.h"
#include "kn_bytes.h"
#include "formats/gguf.h"
#include "formats/hfconfig.h"
#include "formats/llama2c.h"
#include "formats/llmc_gpt2.h"
#include "formats/mapfile.h"
#include "formats/safetensors.h"
#include "core/fp16.h"
#include <stdint.h>
#include <unistd.h>

/* ---- byte builder (kn_bytes.h) and in-place patches --------------------------- */

static void put_u32_at(uint8_t *p, size_t at, uint32_t v) { for (int i = 0; i < 4; i++) p[at + i] = (uint8_t)(v >> (8 * i)); }
static void put_u64_at(uint8_t *p, size_t at, uint64_t v) { for (int i = 0; i < 8; i++) p[at + i] = (uint8_t)(v >> (8 * i)); }

/* ---- a small valid GGUF, with the byte positions of interesting fields --------- */

typedef struct ggf {
    bb b;
    size_t version, n_tensors, n_kv;          /* header fields                      */
    size_t key0_len, key_u8, key_i8;          /* first key's length; two 7-char keys */
    size_t align_val, kv_type_u16, str_len;   /* alignment value; a kv type; a string value's length */
    size_t arr_n;                             /* count of the f32 array             */
    size_t t_name[3], t_ndims[3], t_ne[3], t_type[3], t_off[3];
    size_t data_start;
} ggf;

static void build_gguf(ggf *g, uint32_t version) {
    memset(g, 0, sizeof *g);
    bb *b = &g->b;
    bb_put(b, "GGUF", 4);
    g->version = b->n; bb_u32(b, version);
    g->n_tensors = b->n; bb_u64(b, 3);
    g->n_kv = b->n; bb_u64(b, 17);
    g->key0_len = b->n;
    bb_str(b, "general.architecture"); bb_u32(b, 8); g->str_len = b->n; bb_str(b, "llama");
    bb_str(b, "general.alignment"); bb_u32(b, 4); g->align_val = b->n; bb_u32(b, 32);
    g->key_u8 = b->n; bb_str(b, "test.u8"); bb_u32(b, 0); bb_u8(b, 200);
    g->key_i8 = b->n; bb_str(b, "test.i8"); bb_u32(b, 1); bb_u8(b, (uint8_t)-5);
    bb_str(b, "test.u16"); g->kv_type_u16 = b->n; bb_u32(b, 2); bb_u16(b, 60000);
    bb_str(b, "test.i16"); bb_u32(b, 3); bb_u16(b, (uint16_t)-300);
    bb_str(b, "test.u32"); bb_u32(b, 4); bb_u32(b, 4000000000u);
    bb_str(b, "test.i32"); bb_u32(b, 5); bb_u32(b, (uint32_t)-70000);
    bb_str(b, "test.f32"); bb_u32(b, 6); bb_f32(b, 0.5f);
    bb_str(b, "test.bool"); bb_u32(b, 7); bb_u8(b, 1);
    bb_str(b, "test.u64"); bb_u32(b, 10); bb_u64(b, UINT64_MAX);
    bb_str(b, "test.i64"); bb_u32(b, 11); bb_u64(b, (uint64_t)-5000000000ll);
    bb_str(b, "test.f64"); bb_u32(b, 12); { double d = -2.25; uint64_t u; memcpy(&u, &d, 8); bb_u64(b, u); }
    bb_str(b, "test.strs"); bb_u32(b, 9); bb_u32(b, 8); bb_u64(b, 3);
    bb_str(b, "a"); bb_str(b, "bc"); bb_str(b, "d\xc3\xa9" "f");
    bb_str(b, "test.f32s"); bb_u32(b, 9); bb_u32(b, 6); g->arr_n = b->n; bb_u64(b, 3);
    bb_f32(b, 1); bb_f32(b, 2); bb_f32(b, 3);
    /* [[1, 2], [3]] as u32 arrays */
    bb_str(b, "test.nested"); bb_u32(b, 9); bb_u32(b, 9); bb_u64(b, 2);
    bb_u32(b, 4); bb_u64(b, 2); bb_u32(b, 1); bb_u32(b, 2);
    bb_u32(b, 4); bb_u64(b, 1); bb_u32(b, 3);
    bb_str(b, "test.empty"); bb_u32(b, 9); bb_u32(b, 4); bb_u64(b, 0);
    /* tensors: t0 f32 [4,2] @0 (32 B); t1 q8_0 [32] @32 (34 B); t2 f16 [2,2,2] @96 (16 B) */
    static const struct { const char *name; uint32_t nd; uint64_t ne[3]; uint32_t type; uint64_t off; } ts[3] = {
        {"t0", 2, {4, 2, 0}, 0, 0}, {"t1", 1, {32, 0, 0}, 8, 32}, {"t2", 3, {2, 2, 2}, 1, 96},
    };
    for (int i = 0; i < 3; i++) {
        g->t_name[i] = b->n; bb_str(b, ts[i].name);
        g->t_ndims[i] = b->n; bb_u32(b, ts[i].nd);
        g->t_ne[i] = b->n;
        for (uint32_t d = 0; d < ts[i].nd; d++) bb_u64(b, ts[i].ne[d]);
        g->t_type[i] = b->n; bb_u32(b, ts[i].type);
        g->t_off[i] = b->n; bb_u64(b, ts[i].off);
    }
    bb_pad(b, 32);
    g->data_start = b->n;
    for (int i = 0; i < 8; i++) bb_f32(b, (float)i);             /* t0 */
    bb_u16(b, 0x3c00);                                            /* t1: d = 1.0 */
    for (int i = 0; i < 32; i++) bb_u8(b, (uint8_t)(i - 16));
    bb_pad(b, 32);
    for (int i = 0; i < 8; i++) bb_u16(b, kn_fp32_to_fp16((float)i)); /* t2 */
}

/* Expect kn_gguf_open_memory to fail on buf with a message containing `want` (if any). */
static void expect_gguf_fail(const uint8_t *buf, size_t n, const char *what, const char *want) {
    kn_gguf *g = (kn_gguf *)1;
    kn_clear_error();
    kn_status s = kn_gguf_open_memory(buf, n, &g);
    CHECK(s != KN_OK, "%s: expected an error", what);
    CHECK(g == NULL, "%s: handle must be NULL on error", what);
    CHECK(kn_last_error()[0] != 0, "%s: no message", what);
    if (want) CHECK(strstr(kn_last_error(), want) != NULL, "%s: message '%s' lacks '%s'", what, kn_last_error(), want);
    if (s == KN_OK) kn_gguf_close(g);
}

TEST(gguf_valid_built) {
    ggf f;
    build_gguf(&f, 3);
    kn_gguf *g;
    kn_status s = kn_gguf_open_memory(f.b.p, f.b.n, &g);
    REQUIRE(s == KN_OK, "%s", kn_last_error());
    CHECK(kn_gguf_version(g) == 3, "version");
    CHECK(kn_gguf_alignment(g) == 32, "alignment");
    CHECK(kn_gguf_n_kv(g) == 17, "n_kv %lld", (long long)kn_gguf_n_kv(g));
    CHECK(kn_gguf_n_tensors(g) == 3, "n_tensors");
    CHECK(kn_gguf_data_offset(g) == f.data_start, "data offset %llu vs %zu",
          (unsigned long long)kn_gguf_data_offset(g), f.data_start);
    int64_t i64; uint64_t u64; double f64; bool bo; kn_gguf_str str;
    CHECK(kn_gguf_get_i64(g, "test.u8", &i64) && i64 == 200, "u8");
    CHECK(kn_gguf_get_i64(g, "test.i8", &i64) && i64 == -5, "i8");
    CHECK(kn_gguf_get_u64(g, "test.u16", &u64) && u64 == 60000, "u16");
    CHECK(kn_gguf_get_i64(g, "test.i16", &i64) && i64 == -300, "i16");
    CHECK(kn_gguf_get_u64(g, "test.u32", &u64) && u64 == 4000000000u, "u32");
    CHECK(kn_gguf_get_i64(g, "test.i32", &i64) && i64 == -70000, "i32");
    CHECK(!kn_gguf_get_u64(g, "test.i32", &u64), "negative i32 must not convert to u64");
    CHECK(kn_gguf_get_f64(g, "test.f32", &f64) && f64 == 0.5, "f32");
    CHECK(kn_gguf_get_bool(g, "test.bool", &bo) && bo, "bool");
    CHECK(kn_gguf_get_u64(g, "test.u64", &u64) && u64 == UINT64_MAX, "u64");
    CHECK(!kn_gguf_get_i64(g, "test.u64", &i64), "u64 max must not fit i64");
    CHECK(kn_gguf_get_i64(g, "test.i64", &i64) && i64 == -5000000000ll, "i64");
    CHECK(kn_gguf_get_f64(g, "test.f64", &f64) && f64 == -2.25, "f64");
    CHECK(kn_gguf_get_f64(g, "test.i16", &f64) && f64 == -300, "int as f64");
    CHECK(!kn_gguf_get_str(g, "test.f64", &str), "f64 is not a string");
    CHECK(!kn_gguf_get_i64(g, "absent", &i64), "absent");
    CHECK(kn_gguf_get_str(g, "general.architecture", &str) && str.len == 5 && !memcmp(str.ptr, "llama", 5), "str");
    int64_t ki = kn_gguf_find_key(g, "test.bool");
    CHECK(ki == 9 && kn_gguf_kv_type(g, ki) == KN_GGUF_BOOL, "find_key %lld", (long long)ki);
    CHECK(kn_gguf_key(g, ki).len == 9, "key");
    kn_gguf_type et; uint64_t n; const void *data;
    CHECK(kn_gguf_get_arr(g, "test.strs", &et, &n, &data) && et == KN_GGUF_STRING && n == 3 && data == NULL, "strs");
    kn_gguf_str s2 = kn_gguf_arr_str(g, "test.strs", 2);
    CHECK(s2.len == 4 && !memcmp(s2.ptr, "d\xc3\xa9" "f", 4), "strs[2]");
    CHECK(kn_gguf_arr_str(g, "test.strs", 3).ptr == NULL, "strs[3] out of range");
    CHECK(kn_gguf_arr_str(g, "test.f32s", 0).ptr == NULL, "arr_str on f32 array");
    CHECK(kn_gguf_get_arr(g, "test.f32s", &et, &n, &data) && et == KN_GGUF_F32 && n == 3 && data, "f32s");
    if (data) { float v[3]; memcpy(v, data, 12); CHECK(v[0] == 1 && v[1] == 2 && v[2] == 3, "f32s values"); }
    CHECK(kn_gguf_get_arr(g, "test.nested", &et, &n, &data) && et == KN_GGUF_ARRAY && n == 2 && data == NULL, "nested");
    CHECK(kn_gguf_get_arr(g, "test.empty", &et, &n, &data) && n == 0, "empty array");
    const kn_gguf_tensor *t0 = kn_gguf_find_tensor(g, "t0"), *t1 = kn_gguf_find_tensor(g, "t1"),
                         *t2 = kn_gguf_find_tensor(g, "t2");
    REQUIRE(t0 && t1 && t2, "tensors");
    CHECK(kn_gguf_find_tensor(g, "t3") == NULL && kn_gguf_find_tensor(g, "t") == NULL, "absent tensor");
    CHECK(t0 == kn_gguf_tensor_at(g, 0) && kn_gguf_tensor_at(g, 3) == NULL, "tensor_at");
    CHECK(t0->type == KN_F32 && t0->n_dims == 2 && t0->ne[0] == 4 && t0->ne[1] == 2 && t0->ne[2] == 1 &&
          t0->nbytes == 32, "t0 desc");
    CHECK(t1->type == KN_Q8_0 && t1->ggml_type == 8 && t1->nbytes == 34 && t1->offset == 32, "t1 desc");
    CHECK(t2->type == KN_F16 && t2->n_dims == 3 && t2->nbytes == 16, "t2 desc");
    float v; memcpy(&v, (const uint8_t *)t0->data + 7 * 4, 4);
    CHECK(v == 7.0f, "t0[7] = %g", v);
    uint16_t h; memcpy(&h, (const uint8_t *)t2->data + 5 * 2, 2);
    CHECK(kn_fp16_to_fp32(h) == 5.0f, "t2[5]");
    CHECK((const uint8_t *)t0->data == f.b.p + f.data_start, "t0 data pointer");
    FILE *tf = tmpfile();
    if (tf) {
        kn_gguf_print(g, tf);
        long sz = ftell(tf);
        rewind(tf);
        char *txt = calloc(1, (size_t)sz + 1);
        CHECK(fread(txt, 1, (size_t)sz, tf) == (size_t)sz, "read back print");
        CHECK(strstr(txt, "GGUF v3") && strstr(txt, "\"test.f64\" f64 = -2.25") && strstr(txt, "\"t1\" q8_0 [32]") &&
              strstr(txt, "string[3] [\"a\", \"bc\"") && strstr(txt, "nested"), "print output:\n%s", txt);
        free(txt);
        fclose(tf);
    }
    kn_gguf_close(g);
    kn_gguf_close(NULL);
    /* version 2 is accepted as well */
    put_u32_at(f.b.p, f.version, 2);
    s = kn_gguf_open_memory(f.b.p, f.b.n, &g);
    CHECK(s == KN_OK && kn_gguf_version(g) == 2, "v2: %s", kn_last_error());
    kn_gguf_close(g);
    free(f.b.p);
}

TEST(gguf_truncated_every_prefix) {
    ggf f;
    build_gguf(&f, 3);
    /* every prefix of the header and of the data section must be refused */
    for (size_t n = 0; n < f.b.n; n++) {
        uint8_t *cp = malloc(n ? n : 1);      /* exact-size copy: ASan sees any over-read */
        memcpy(cp, f.b.p, n);
        char what[64];
        snprintf(what, sizeof what, "prefix %zu/%zu", n, f.b.n);
        expect_gguf_fail(cp, n, what, NULL);
        free(cp);
    }
    free(f.b.p);
}

typedef void (*ggf_mut)(ggf *f);
static void m_magic(ggf *f) { f->b.p[0] = 'X'; }
static void m_magic_be(ggf *f) { memcpy(f->b.p, "FUGG", 4); }
static void m_v1(ggf *f) { put_u32_at(f->b.p, f->version, 1); }
static void m_v99(ggf *f) { put_u32_at(f->b.p, f->version, 99); }
static void m_huge_nkv(ggf *f) { put_u64_at(f->b.p, f->n_kv, UINT64_MAX); }
static void m_big_nkv(ggf *f) { put_u64_at(f->b.p, f->n_kv, 1ull << 40); }
static void m_huge_ntensors(ggf *f) { put_u64_at(f->b.p, f->n_tensors, UINT64_MAX / 2); }
static void m_more_kv(ggf *f) { put_u64_at(f->b.p, f->n_kv, 18); }
static void m_key_len(ggf *f) { put_u64_at(f->b.p, f->key0_len, UINT64_MAX); }
static void m_key_len_past(ggf *f) { put_u64_at(f->b.p, f->key0_len, f->b.n); }
static void m_str_len(ggf *f) { put_u64_at(f->b.p, f->str_len, f->b.n); }
static void m_arr_n(ggf *f) { put_u64_at(f->b.p, f->arr_n, 1ull << 61); }
static void m_kv_type(ggf *f) { put_u32_at(f->b.p, f->kv_type_u16, 13); }
static void m_dup_key(ggf *f) { f->b.p[f->key_i8 + 8 + 5] = 'u'; }        /* test.i8 -> test.u8 */
static void m_bad_utf8_key(ggf *f) { f->b.p[f->key_u8 + 8 + 5] = 0xff; }
static void m_align_3(ggf *f) { put_u32_at(f->b.p, f->align_val, 24); }
static void m_align_0(ggf *f) { put_u32_at(f->b.p, f->align_val, 0); }
static void m_off_past(ggf *f) { put_u64_at(f->b.p, f->t_off[2], 1ull << 20); }
static void m_off_huge(ggf *f) { put_u64_at(f->b.p, f->t_off[2], UINT64_MAX - 31); }
static void m_off_misaligned(ggf *f) { put_u64_at(f->b.p, f->t_off[2], 100); }
static void m_overlap(ggf *f) { put_u64_at(f->b.p, f->t_off[2], 0); }
static void m_dup_tensor(ggf *f) { f->b.p[f->t_name[2] + 8 + 1] = '0'; }  /* t2 -> t0 */
static void m_ndims0(ggf *f) { put_u32_at(f->b.p, f->t_ndims[0], 0); }
static void m_ndims5(ggf *f) { put_u32_at(f->b.p, f->t_ndims[0], 5); }
static void m_type_iq2(ggf *f) { put_u32_at(f->b.p, f->t_type[1], 16); }
static void m_type_999(ggf *f) { put_u32_at(f->b.p, f->t_type[1], 999); }
static void m_ne0(ggf *f) { put_u64_at(f->b.p, f->t_ne[0] + 8, 0); }
static void m_ne_overflow(ggf *f) {
    put_u64_at(f->b.p, f->t_ne[2], 1ull << 40);
    put_u64_at(f->b.p, f->t_ne[2] + 8, 1ull << 40);
}
static void m_ne_neg(ggf *f) { put_u64_at(f->b.p, f->t_ne[0], 1ull << 63); }
static void m_ne_big(ggf *f) { put_u64_at(f->b.p, f->t_ne[0], 1ull << 40); }
static void m_block(ggf *f) { put_u64_at(f->b.p, f->t_ne[1], 16); }
static void m_bytes_overflow(ggf *f) { put_u64_at(f->b.p, f->t_ne[0], 1ull << 62); put_u64_at(f->b.p, f->t_ne[0] + 8, 1); }

TEST(gguf_corrupt_table) {
    static const struct { const char *name; ggf_mut fn; const char *want; } cases[] = {
        {"wrong magic", m_magic, "GGUF"},
        {"big-endian magic", m_magic_be, "big-endian"},
        {"version 1", m_v1, "version 1"},
        {"version 99", m_v99, "version 99"},
        {"n_kv = 2^64-1", m_huge_nkv, "key/value pairs"},
        {"n_kv = 2^40", m_big_nkv, "key/value pairs"},
        {"n_tensors huge", m_huge_ntensors, "tensors"},
        {"one kv more than present", m_more_kv, NULL},
        {"key length 2^64-1", m_key_len, "byte 24"},
        {"key length past end", m_key_len_past, "past the end"},
        {"string value past end", m_str_len, "general.architecture"},
        {"array count huge", m_arr_n, "test.f32s"},
        {"unknown kv type", m_kv_type, "test.u16"},
        {"duplicate key", m_dup_key, "duplicate key 'test.u8'"},
        {"invalid UTF-8 key", m_bad_utf8_key, "UTF-8"},
        {"alignment 24", m_align_3, "power of two"},
        {"alignment 0", m_align_0, "power of two"},
        {"offset past end", m_off_past, "'t2'"},
        {"offset near 2^64", m_off_huge, "'t2'"},
        {"misaligned offset", m_off_misaligned, "alignment"},
        {"overlapping tensors", m_overlap, "overlap"},
        {"duplicate tensor name", m_dup_tensor, "duplicate tensor name 't0'"},
        {"n_dims 0", m_ndims0, "'t0'"},
        {"n_dims 5", m_ndims5, "5 dimensions"},
        {"type IQ2_XXS", m_type_iq2, "tensor 't1' has GGML type 16 (IQ2_XXS) which kiln does not support yet"},
        {"type 999", m_type_999, "GGML type 999"},
        {"ne = 0", m_ne0, "ne[1] = 0"},
        {"element count overflow", m_ne_overflow, "overflow"},
        {"ne >= 2^63", m_ne_neg, "'t0'"},
        {"tensor larger than file", m_ne_big, "'t0'"},
        {"ne[0] not a block multiple", m_block, "block size"},
        {"byte count overflow", m_bytes_overflow, "'t0'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ggf f;
        build_gguf(&f, 3);
        cases[i].fn(&f);
        uint8_t *cp = malloc(f.b.n);
        memcpy(cp, f.b.p, f.b.n);
        expect_gguf_fail(cp, f.b.n, cases[i].name, cases[i].want);
        free(cp);
        free(f.b.p);
    }
}

TEST(gguf_nested_arrays) {
    /* arrays nested 8 deep are fine, 9 deep are refused, both without recursion */
    for (int depth = 8; depth <= 9; depth++) {
        bb b = {0};
        bb_put(&b, "GGUF", 4); bb_u32(&b, 3); bb_u64(&b, 0); bb_u64(&b, 1);
        bb_str(&b, "deep"); bb_u32(&b, 9);
        for (int d = 0; d < depth - 1; d++) { bb_u32(&b, 9); bb_u64(&b, 1); }
        bb_u32(&b, 4); bb_u64(&b, 2); bb_u32(&b, 7); bb_u32(&b, 8);
        kn_gguf *g;
        kn_status s = kn_gguf_open_memory(b.p, b.n, &g);
        if (depth == 8) {
            CHECK(s == KN_OK, "depth 8: %s", kn_last_error());
            kn_gguf_type et; uint64_t n;
            CHECK(s == KN_OK && kn_gguf_get_arr(g, "deep", &et, &n, NULL) && et == KN_GGUF_ARRAY && n == 1, "deep arr");
            kn_gguf_close(g);
        } else {
            CHECK(s != KN_OK && strstr(kn_last_error(), "nested"), "depth 9 must fail: %s", kn_last_error());
        }
        free(b.p);
    }
    /* many empty nested arrays: [[], [], ...] x 1000 */
    bb b = {0};
    bb_put(&b, "GGUF", 4); bb_u32(&b, 3); bb_u64(&b, 0); bb_u64(&b, 1);
    bb_str(&b, "many"); bb_u32(&b, 9); bb_u32(&b, 9); bb_u64(&b, 1000);
    for (int i = 0; i < 1000; i++) { bb_u32(&b, 8); bb_u64(&b, 0); }
    kn_gguf *g;
    CHECK(kn_gguf_open_memory(b.p, b.n, &g) == KN_OK, "%s", kn_last_error());
    kn_gguf_close(g);
    /* the same with one element too many claimed */
    put_u64_at(b.p, 4 + 4 + 8 + 8 + 8 + 4 + 4 + 4, 1001);
    CHECK(kn_gguf_open_memory(b.p, b.n, &g) != KN_OK, "1001 claimed, 1000 present");
    free(b.p);
}

TEST(gguf_real_tiny_random) {
    const char *p = kn_asset("gguf/llama-2-tiny-random.gguf");
    if (!p) SKIP("asset gguf/llama-2-tiny-random.gguf missing");
    kn_gguf *g;
    REQUIRE(kn_gguf_open(p, &g) == KN_OK, "%s", kn_last_error());
    CHECK(kn_gguf_version(g) == 3, "version");
    CHECK(kn_gguf_n_kv(g) == 18, "n_kv %lld", (long long)kn_gguf_n_kv(g));
    CHECK(kn_gguf_n_tensors(g) == 12, "n_tensors %lld", (long long)kn_gguf_n_tensors(g));
    CHECK(kn_gguf_data_offset(g) == 724416, "data offset %llu", (unsigned long long)kn_gguf_data_offset(g));
    int64_t v;
    CHECK(kn_gguf_get_i64(g, "llama.embedding_length", &v) && v == 8, "n_embd");
    CHECK(kn_gguf_get_i64(g, "llama.attention.head_count", &v) && v == 2, "heads");
    const kn_gguf_tensor *t = kn_gguf_find_tensor(g, "output.weight");
    CHECK(t && t->type == KN_F16 && t->ne[0] == 8 && t->ne[1] == 32000 && t->nbytes == 512000, "output.weight");
    /* the last tensor ends exactly at the end of the file */
    uint64_t end = 0;
    for (int64_t i = 0; i < kn_gguf_n_tensors(g); i++) {
        const kn_gguf_tensor *x = kn_gguf_tensor_at(g, i);
        if (x->offset + x->nbytes > end) end = x->offset + x->nbytes;
    }
    CHECK(724416 + end == 1750560, "data end %llu", (unsigned long long)(724416 + end));
    kn_gguf_str s = kn_gguf_arr_str(g, "tokenizer.ggml.tokens", 1);
    CHECK(s.len == 3 && !memcmp(s.ptr, "<s>", 3), "token 1");
    kn_gguf_close(g);
    /* the same bytes minus the last one must be refused */
    kn_mapfile *m;
    REQUIRE(kn_mapfile_open(p, &m) == KN_OK, "%s", kn_last_error());
    uint8_t *cp = malloc(m->size - 1);
    memcpy(cp, m->data, m->size - 1);
    expect_gguf_fail(cp, m->size - 1, "tiny-random minus one byte", "output.weight");
    free(cp);
    kn_mapfile_close(m);
}

TEST(gguf_real_vocab_only) {
    const char *p1 = kn_asset("gguf/ggml-vocab-llama-spm.gguf"), *p2 = kn_asset("gguf/ggml-vocab-gpt-2.gguf");
    if (!p1 || !p2) SKIP("vocab GGUF assets missing");
    kn_gguf *g;
    REQUIRE(kn_gguf_open(p1, &g) == KN_OK, "%s", kn_last_error());
    CHECK(kn_gguf_n_tensors(g) == 0 && kn_gguf_n_kv(g) == 22, "llama-spm counts");
    kn_gguf_type et; uint64_t n; const void *d;
    CHECK(kn_gguf_get_arr(g, "tokenizer.ggml.scores", &et, &n, &d) && et == KN_GGUF_F32 && n == 32000 && d, "scores");
    kn_gguf_str s = kn_gguf_arr_str(g, "tokenizer.ggml.tokens", 0);
    CHECK(s.len == 5 && !memcmp(s.ptr, "<unk>", 5), "token 0");
    s = kn_gguf_arr_str(g, "tokenizer.ggml.tokens", 31999);
    CHECK(s.ptr && s.len > 0, "token 31999");
    bool b;
    CHECK(kn_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) && b, "add_bos");
    kn_gguf_close(g);
    REQUIRE(kn_gguf_open(p2, &g) == KN_OK, "%s", kn_last_error());
    CHECK(kn_gguf_n_tensors(g) == 0 && kn_gguf_n_kv(g) == 16, "gpt2 counts");
    CHECK(kn_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &d) && et == KN_GGUF_STRING && n == 50000, "merges");
    s = kn_gguf_arr_str(g, "tokenizer.ggml.merges", 2);
    CHECK(s.len == 3 && !memcmp(s.ptr, "h e", 3), "merge 2");
    CHECK(kn_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &d) && n == 50257, "tokens");
    kn_gguf_close(g);
}

TEST(gguf_open_errors) {
    kn_gguf *g = (kn_gguf *)1;
    CHECK(kn_gguf_open("/nonexistent/x.gguf", &g) == KN_ERR_IO && g == NULL, "missing file");
    CHECK(strstr(kn_last_error(), "/nonexistent/x.gguf") != NULL, "message names the path: %s", kn_last_error());
    CHECK(kn_gguf_open_memory(NULL, 0, &g) == KN_ERR_FORMAT, "empty input");
}

/* ---- mapfile -------------------------------------------------------------------- */

TEST(mapfile_basics) {
    char path[] = "/tmp/kn_test_mapXXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    kn_mapfile *m;
    REQUIRE(kn_mapfile_open(path, &m) == KN_OK, "empty file: %s", kn_last_error());
    CHECK(m->size == 0 && m->data != NULL, "empty file maps to size 0");
    kn_mapfile_close(m);
    FILE *f = fopen(path, "wb");
    fputs("hello", f);
    fclose(f);
    REQUIRE(kn_mapfile_open(path, &m) == KN_OK, "%s", kn_last_error());
    CHECK(m->size == 5 && !memcmp(m->data, "hello", 5) && m->mapped, "content");
    kn_mapfile_close(m);
    kn_mapfile_close(NULL);
    remove(path);
    CHECK(kn_mapfile_open("/tmp", &m) == KN_ERR_IO && m == NULL, "directory refused");
    CHECK(kn_mapfile_open(path, &m) == KN_ERR_IO && strstr(kn_last_error(), path), "missing: %s", kn_last_error());
}

/* ---- JSON ----------------------------------------------------------------------- */

TEST(json_valid) {
    const char *txt =
        " {\"a\": 1, \"b\": [true, false, null, -0.5e1, 12345678901234567890, -9223372036854775808],\n"
        "  \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20ac\\ud83d\\ude00\\u0000y\", \"e\": {}, \"ea\": [],"
        "  \"nested\": {\"k\": {\"deep\": \"v\"}}, \"utf\": \"h\xc3\xa9\", \"a\": 2, \"f\": 1e3 } ";
    kn_json *j;
    REQUIRE(kn_json_parse(txt, strlen(txt), &j) == KN_OK, "%s", kn_last_error());
    CHECK(kn_json_kind(j, 0) == KN_JSON_OBJECT && kn_json_count(j, 0) == 9, "root %lld", (long long)kn_json_count(j, 0));
    int64_t v;
    CHECK(kn_json_get_i64(j, 0, "a", &v) && v == 1, "first duplicate wins");
    int64_t b = kn_json_get(j, 0, "b");
    CHECK(kn_json_count(j, b) == 6, "b count");
    bool bo;
    CHECK(kn_json_bool(j, kn_json_at(j, b, 0), &bo) && bo, "true");
    CHECK(kn_json_bool(j, kn_json_at(j, b, 1), &bo) && !bo, "false");
    CHECK(kn_json_kind(j, kn_json_at(j, b, 2)) == KN_JSON_NULL, "null");
    double d;
    CHECK(kn_json_num(j, kn_json_at(j, b, 3), &d) && d == -5.0, "-0.5e1");
    CHECK(kn_json_int(j, kn_json_at(j, b, 3), &v) && v == -5, "-0.5e1 is the integer -5");
    CHECK(!kn_json_int(j, kn_json_at(j, b, 4), &v) && kn_json_num(j, kn_json_at(j, b, 4), &d) && d > 1.2e19,
          "uint64-range number is a double only");
    CHECK(kn_json_int(j, kn_json_at(j, b, 5), &v) && v == INT64_MIN, "INT64_MIN");
    CHECK(kn_json_at(j, b, 6) == -1, "at out of range");
    size_t len;
    const char *s = kn_json_str(j, kn_json_get(j, 0, "s"), &len);
    const char want[] = "x\"\\/\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0y";
    CHECK(s && len == sizeof want - 1 && !memcmp(s, want, len), "escapes decoded (len %zu)", len);
    CHECK(kn_json_count(j, kn_json_get(j, 0, "e")) == 0 && kn_json_kind(j, kn_json_get(j, 0, "ea")) == KN_JSON_ARRAY,
          "empty containers");
    CHECK(!strcmp(kn_json_get_str(j, kn_json_get(j, kn_json_get(j, 0, "nested"), "k"), "deep"), "v"), "nested");
    CHECK(!strcmp(kn_json_get_str(j, 0, "utf"), "h\xc3\xa9"), "raw utf-8");
    CHECK(kn_json_get_f64(j, 0, "f", &d) && d == 1000, "1e3");
    CHECK(kn_json_get(j, 0, "zz") == -1 && kn_json_get(j, b, "a") == -1, "absent / not object");
    int cnt = 0;
    for (int64_t c = kn_json_first(j, 0); c >= 0; c = kn_json_next(j, c)) cnt++;
    CHECK(cnt == 9, "iteration %d", cnt);
    CHECK(!strcmp(kn_json_key(j, kn_json_first(j, 0), NULL), "a"), "key of first");
    kn_json_free(j);
    kn_json_free(NULL);
    /* scalars at top level */
    CHECK(kn_json_parse("42", 2, &j) == KN_OK && kn_json_int(j, 0, &v) && v == 42, "top-level number");
    kn_json_free(j);
    /* not NUL-terminated: parse only the first 3 bytes of "[1]garbage" */
    CHECK(kn_json_parse("[1]garbage", 3, &j) == KN_OK, "length-bounded");
    kn_json_free(j);
}

TEST(json_invalid) {
    static const char *bad[] = {
        "", " ", "{", "[", "[1,]", "{\"a\":1,}", "{\"a\" 1}", "{1:2}", "[1 2]", "01", "1.", ".5", "-", "1e",
        "+1", "tru", "nul", "\"abc", "\"\\x\"", "\"\\u12g4\"", "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800\\u0041\"",
        "\"a\x01\"", "\"\xff\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe2\x82\"", "[1]]", "{} {}", "NaN", "[1e5",
        "{\"a\":}", "[\"a\":1]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kn_json *j = (kn_json *)1;
        kn_clear_error();
        kn_status s = kn_json_parse(bad[i], strlen(bad[i]), &j);
        CHECK(s != KN_OK && j == NULL && kn_last_error()[0], "case %zu '%s' must fail", i, bad[i]);
        if (s == KN_OK) kn_json_free(j);
    }
    /* nesting: KN_JSON_MAX_DEPTH levels parse, one more is a limit error, 100k never recurses */
    size_t n = 100000;
    char *deep = malloc(2 * n);
    for (size_t i = 0; i < n; i++) { deep[i] = '['; deep[2 * n - 1 - i] = ']'; }
    kn_json *j;
    CHECK(kn_json_parse(deep + n - KN_JSON_MAX_DEPTH, 2 * KN_JSON_MAX_DEPTH, &j) == KN_OK, "max depth ok: %s", kn_last_error());
    kn_json_free(j);
    CHECK(kn_json_parse(deep + n - KN_JSON_MAX_DEPTH - 1, 2 * KN_JSON_MAX_DEPTH + 2, &j) == KN_ERR_LIMIT, "depth+1");
    CHECK(kn_json_parse(deep, 2 * n, &j) == KN_ERR_LIMIT, "100k deep");
    CHECK(kn_json_parse(deep, n, &j) != KN_OK, "unclosed");
    free(deep);
}

TEST(json_load_config) {
    char path[] = "/tmp/kn_test_cfgXXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    const char *cfg = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 576, \"rms_norm_eps\": 1e-05,"
                      " \"tie_word_embeddings\": true, \"rope_scaling\": null}\n";
    CHECK(write(fd, cfg, strlen(cfg)) == (ssize_t)strlen(cfg), "write");
    close(fd);
    kn_json *j;
    REQUIRE(kn_json_load(path, &j) == KN_OK, "%s", kn_last_error());
    int64_t h; double eps; bool tie;
    CHECK(kn_json_get_i64(j, 0, "hidden_size", &h) && h == 576, "hidden_size");
    CHECK(kn_json_get_f64(j, 0, "rms_norm_eps", &eps) && eps == 1e-5, "eps");
    CHECK(kn_json_get_bool(j, 0, "tie_word_embeddings", &tie) && tie, "tie");
    CHECK(!strcmp(kn_json_str(j, kn_json_at(j, kn_json_get(j, 0, "architectures"), 0), NULL), "LlamaForCausalLM"), "arch");
    CHECK(!kn_json_get_i64(j, 0, "rope_scaling", &h), "null is not an int");
    kn_json_free(j);
    remove(path);
    CHECK(kn_json_load(path, &j) == KN_ERR_IO, "missing file");
}

/* ---- safetensors ------------------------------------------------------------------ */

TEST(safetensors_roundtrip) {
    char path[] = "/tmp/kn_test_stXXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t bf[4] = {0x3f80, 0x4000, 0xbf80, 0};
    int64_t i64 = -1234567890123ll;
    const char *names[] = {"w.a", "w.bf\"q\\", "scalar", "empty", "h\xc3\xa9"};
    kn_dtype dt[] = {KN_F32, KN_BF16, KN_I64, KN_U8, KN_BOOL};
    int nd[] = {2, 1, 0, 2, 1};
    const int64_t shp[][KN_ST_MAX_DIMS] = {{2, 3}, {4}, {0}, {0, 5}, {3}};
    uint8_t bools[3] = {1, 0, 1};
    const void *datas[] = {a, bf, &i64, NULL, bools};
    const char *meta[] = {"format", "pt", "note", "line\nbreak \"q\" \x01"};
    REQUIRE(kn_safetensors_write(path, 5, names, dt, nd, shp, datas, 2, meta) == KN_OK, "%s", kn_last_error());
    kn_mapfile *mf;
    REQUIRE(kn_mapfile_open(path, &mf) == KN_OK, "%s", kn_last_error());
    const uint8_t *raw = mf->data;
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++) hn |= (uint64_t)raw[i] << (8 * i);
    CHECK(hn % 8 == 0 && raw[8] == '{' && (raw[8 + hn - 1] == ' ' || raw[8 + hn - 1] == '}'), "header padded with spaces");
    CHECK(mf->size == 8 + hn + 24 + 8 + 8 + 0 + 3, "file size %zu", mf->size);
    kn_mapfile_close(mf);
    kn_safetensors *st;
    REQUIRE(kn_safetensors_open(path, &st) == KN_OK, "%s", kn_last_error());
    CHECK(kn_safetensors_n_tensors(st) == 5, "n");
    const kn_st_tensor *t = kn_safetensors_find(st, "w.a");
    REQUIRE(t, "w.a");
    CHECK(t->dtype == KN_F32 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 3 && t->nbytes == 24 &&
          !memcmp(t->data, a, 24), "w.a content");
    t = kn_safetensors_find(st, "w.bf\"q\\");
    CHECK(t && t->dtype == KN_BF16 && t->ndim == 1 && t->shape[0] == 4 && !memcmp(t->data, bf, 8), "escaped name");
    t = kn_safetensors_find(st, "scalar");
    CHECK(t && t->dtype == KN_I64 && t->ndim == 0 && t->nbytes == 8 && !memcmp(t->data, &i64, 8), "scalar");
    t = kn_safetensors_find(st, "empty");
    CHECK(t && t->nbytes == 0 && t->ndim == 2 && t->shape[1] == 5, "empty");
    t = kn_safetensors_find(st, "h\xc3\xa9");
    CHECK(t && t->dtype == KN_BOOL && !memcmp(t->data, bools, 3), "utf-8 name, bool");
    CHECK(kn_safetensors_tensor_at(st, 0) && !strcmp(kn_safetensors_tensor_at(st, 0)->name, "w.a"), "order kept");
    /* every tensor aligned to its element size within the file */
    for (int64_t i = 0; i < kn_safetensors_n_tensors(st); i++) {
        const kn_st_tensor *x = kn_safetensors_tensor_at(st, i);
        size_t es = kn_dtype_get(x->dtype)->type_size;
        CHECK(((uintptr_t)x->data) % es == 0, "%s misaligned", x->name);
    }
    CHECK(kn_safetensors_find(st, "nope") == NULL && kn_safetensors_tensor_at(st, 5) == NULL, "absent");
    CHECK(!strcmp(kn_safetensors_metadata(st, "format"), "pt"), "metadata");
    CHECK(!strcmp(kn_safetensors_metadata(st, "note"), "line\nbreak \"q\" \x01"), "metadata escapes");
    CHECK(kn_safetensors_metadata(st, "zz") == NULL && kn_safetensors_n_metadata(st) == 2, "metadata count");
    const char *k, *v;
    CHECK(kn_safetensors_metadata_at(st, 1, &k, &v) && !strcmp(k, "note"), "metadata_at");
    kn_safetensors_close(st);
    kn_safetensors_close(NULL);
    /* writer refusals */
    const char *dup[] = {"x", "x"};
    kn_dtype dt2[] = {KN_F32, KN_F32};
    int nd2[] = {1, 1};
    const int64_t shp2[][KN_ST_MAX_DIMS] = {{1}, {1}};
    const void *d2[] = {a, a};
    CHECK(kn_safetensors_write(path, 2, dup, dt2, nd2, shp2, d2, 0, NULL) == KN_ERR_INVALID, "duplicate names");
    kn_dtype dq[] = {KN_Q4_0};
    CHECK(kn_safetensors_write(path, 1, names, dq, nd2, shp2, d2, 0, NULL) == KN_ERR_UNSUPPORTED, "quant dtype");
    const char *mdn[] = {"__metadata__"};
    CHECK(kn_safetensors_write(path, 1, mdn, dt2, nd2, shp2, d2, 0, NULL) == KN_ERR_INVALID, "reserved name");
    /* no tensors, no metadata: "{}" padded */
    REQUIRE(kn_safetensors_write(path, 0, NULL, NULL, NULL, NULL, NULL, 0, NULL) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_safetensors_open(path, &st) == KN_OK, "%s", kn_last_error());
    CHECK(kn_safetensors_n_tensors(st) == 0, "empty file");
    kn_safetensors_close(st);
    remove(path);
}

/* Build a safetensors image from a header string and data_len zero bytes. */
static uint8_t *st_image(const char *hdr, size_t data_len, size_t *n) {
    size_t hl = strlen(hdr);
    *n = 8 + hl + data_len;
    uint8_t *p = calloc(1, *n);
    put_u64_at(p, 0, hl);
    memcpy(p + 8, hdr, hl);
    return p;
}

TEST(safetensors_corrupt_table) {
    static const struct { const char *hdr; size_t data; const char *want; } cases[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 7, "'a'"},          /* past end */
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, "need 8"},     /* size mismatch */
        {"{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, "F8_E4M3"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}}", 8, "shape"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "dimensions"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype"},
        {"{\"a\":[1]}", 0, "'a'"},
        {"[1]", 0, "'{'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "duplicate tensor name 'a'"},
        {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__"},
        {"{\"__metadata__\":[]}", 0, "__metadata__"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "'a'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        uint8_t *p = st_image(cases[i].hdr, cases[i].data, &n);
        kn_safetensors *st = (kn_safetensors *)1;
        kn_clear_error();
        kn_status s = kn_safetensors_open_memory(p, n, &st);
        CHECK(s != KN_OK && st == NULL, "case %zu must fail", i);
        CHECK(strstr(kn_last_error(), cases[i].want) != NULL, "case %zu: '%s' lacks '%s'", i, kn_last_error(), cases[i].want);
        if (s == KN_OK) kn_safetensors_close(st);
        free(p);
    }
    /* header length itself past the end, and files shorter than 8 bytes */
    uint8_t small[16] = {0};
    put_u64_at(small, 0, 1000);
    kn_safetensors *st;
    CHECK(kn_safetensors_open_memory(small, 16, &st) == KN_ERR_FORMAT && strstr(kn_last_error(), "header length"), "hn");
    put_u64_at(small, 0, UINT64_MAX);
    CHECK(kn_safetensors_open_memory(small, 16, &st) == KN_ERR_FORMAT, "hn max");
    for (size_t n = 0; n < 8; n++) CHECK(kn_safetensors_open_memory(small, n, &st) == KN_ERR_FORMAT, "short %zu", n);
    /* a valid image parses, and every truncation of it fails */
    size_t n;
    uint8_t *p = st_image("{\"__metadata__\":{\"x\":\"y\"},\"a\":{\"dtype\":\"I32\",\"shape\":[1,2],\"data_offsets\":[0,8]}}  ",
                          8, &n);
    REQUIRE(kn_safetensors_open_memory(p, n, &st) == KN_OK, "%s", kn_last_error());
    kn_safetensors_close(st);
    for (size_t k = 0; k < n; k++) {
        uint8_t *cp = malloc(k ? k : 1);
        memcpy(cp, p, k);
        CHECK(kn_safetensors_open_memory(cp, k, &st) != KN_OK, "prefix %zu", k);
        free(cp);
    }
    free(p);
}

/* ---- llama2.c ------------------------------------------------------------------------ */

static const kn_llama2c_wid g_mats[] = {KN_L2C_TOKEN_EMBEDDING, KN_L2C_WQ, KN_L2C_WK, KN_L2C_WV,
                                        KN_L2C_WO, KN_L2C_W1, KN_L2C_W2, KN_L2C_W3};
#define N_MATS (sizeof g_mats / sizeof g_mats[0])

/* Re-export an opened legacy model as a version 1 (fp32) or 2 (int8, gs) image. */
static uint8_t *l2c_export(const kn_llama2c *m, int version, int gs, size_t *n) {
    const kn_llama2c_config *c = kn_llama2c_config_of(m);
    bb b = {0};
    bb_u32(&b, KN_LLAMA2C_MAGIC); bb_u32(&b, (uint32_t)version);
    const int h[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len};
    for (int i = 0; i < 7; i++) bb_u32(&b, (uint32_t)h[i]);
    bb_u8(&b, c->shared_classifier);
    if (version == 2) bb_u32(&b, (uint32_t)gs);
    while (b.n < 256) bb_u8(&b, 0);
    const kn_llama2c_wid norms[] = {KN_L2C_RMS_ATT, KN_L2C_RMS_FFN, KN_L2C_RMS_FINAL};
    for (int i = 0; i < 3; i++) {
        const kn_llama2c_weight *w = kn_llama2c_weight_of(m, norms[i]);
        for (int l = 0; l < w->n_layers; l++) bb_put(&b, kn_llama2c_layer(m, norms[i], l, NULL), w->nbytes);
    }
    for (size_t i = 0; i < N_MATS + !c->shared_classifier; i++) {
        kn_llama2c_wid id = i < N_MATS ? g_mats[i] : KN_L2C_WCLS;
        const kn_llama2c_weight *w = kn_llama2c_weight_of(m, id);
        for (int l = 0; l < w->n_layers; l++) {
            const float *x = kn_llama2c_layer(m, id, l, NULL);
            int64_t numel = w->rows * w->cols;
            if (version == 1) { bb_put(&b, x, (size_t)numel * 4); continue; }
            int8_t *q = malloc((size_t)numel);
            float *s = malloc((size_t)(numel / gs) * 4);
            for (int64_t gi = 0; gi < numel / gs; gi++) {
                float mx = 0;
                for (int k = 0; k < gs; k++) mx = fmaxf(mx, fabsf(x[gi * gs + k]));
                s[gi] = mx / 127.0f;
                for (int k = 0; k < gs; k++)
                    q[gi * gs + k] = (int8_t)(s[gi] > 0 ? lrintf(x[gi * gs + k] / s[gi]) : 0);
            }
            bb_put(&b, q, (size_t)numel);
            bb_put(&b, s, (size_t)(numel / gs) * 4);
            free(q); free(s);
        }
    }
    *n = b.n;
    return b.p;
}

TEST(llama2c_stories260k) {
    const char *p = kn_asset("llama2c/stories260K.bin");
    if (!p) SKIP("asset llama2c/stories260K.bin missing");
    kn_llama2c *m;
    REQUIRE(kn_llama2c_open(p, &m) == KN_OK, "%s", kn_last_error());
    const kn_llama2c_config *c = kn_llama2c_config_of(m);
    CHECK(c->dim == 64 && c->hidden_dim == 172 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4 &&
          c->vocab_size == 512 && c->seq_len == 512 && c->shared_classifier && c->version == 0 &&
          c->head_size == 8 && c->kv_dim == 32, "config");
    const kn_llama2c_weight *wk = kn_llama2c_weight_of(m, KN_L2C_WK);
    CHECK(wk->rows == 32 && wk->cols == 64 && wk->n_layers == 5 && wk->dtype == KN_F32, "wk shape");
    const kn_llama2c_weight *w2 = kn_llama2c_weight_of(m, KN_L2C_W2);
    CHECK(w2->rows == 64 && w2->cols == 172, "w2 shape");
    CHECK(kn_llama2c_weight_of(m, KN_L2C_WCLS)->data == kn_llama2c_weight_of(m, KN_L2C_TOKEN_EMBEDDING)->data, "shared wcls");
    /* run.c offsets: the embedding right after the 28-byte header; rms_final then 2 freq tables end the file */
    const kn_llama2c_weight *te = kn_llama2c_weight_of(m, KN_L2C_TOKEN_EMBEDDING), *rf = kn_llama2c_weight_of(m, KN_L2C_RMS_FINAL);
    CHECK((const uint8_t *)rf->data - (const uint8_t *)te->data == 4 * (260032 - 64),
          "rms_final offset %td", (const uint8_t *)rf->data - (const uint8_t *)te->data);
    CHECK(kn_llama2c_layer(m, KN_L2C_WQ, 5, NULL) == NULL && kn_llama2c_layer(m, KN_L2C_RMS_FINAL, 1, NULL) == NULL, "range");
    CHECK((const uint8_t *)kn_llama2c_layer(m, KN_L2C_WQ, 1, NULL) - (const uint8_t *)kn_llama2c_layer(m, KN_L2C_WQ, 0, NULL) ==
          64 * 64 * 4, "layer stride");
    /* rms norm weights of a trained model: finite, mostly positive, O(1) */
    const float *ra = kn_llama2c_layer(m, KN_L2C_RMS_ATT, 0, NULL);
    double sum = 0;
    for (int i = 0; i < 64; i++) { CHECK(isfinite(ra[i]), "finite"); sum += ra[i]; }
    CHECK(sum / 64 > 0.05 && sum / 64 < 10, "rms_att mean %g", sum / 64);

    /* re-export as version 1 and 2, read back, compare with the legacy weights */
    size_t n1, n2;
    uint8_t *v1 = l2c_export(m, 1, 0, &n1), *v2 = l2c_export(m, 2, 64, &n2);
    kn_llama2c *m1, *m2;
    REQUIRE(kn_llama2c_open_memory(v1, n1, &m1) == KN_OK, "v1: %s", kn_last_error());
    REQUIRE(kn_llama2c_open_memory(v2, n2, &m2) == KN_OK, "v2: %s", kn_last_error());
    CHECK(kn_llama2c_config_of(m1)->version == 1 && kn_llama2c_config_of(m2)->group_size == 64, "versions");
    for (int id = 0; id < KN_L2C_COUNT; id++) {
        const kn_llama2c_weight *w = kn_llama2c_weight_of(m, (kn_llama2c_wid)id);
        for (int l = 0; l < w->n_layers; l++) {
            const float *x = kn_llama2c_layer(m, (kn_llama2c_wid)id, l, NULL);
            const float *y = kn_llama2c_layer(m1, (kn_llama2c_wid)id, l, NULL);
            CHECK(y && !memcmp(x, y, w->nbytes), "v1 %s layer %d differs", w->name, l);
            const float *sc;
            const void *z = kn_llama2c_layer(m2, (kn_llama2c_wid)id, l, &sc);
            const kn_llama2c_weight *wz = kn_llama2c_weight_of(m2, (kn_llama2c_wid)id);
            if (!z) { CHECK(0, "v2 %s missing", w->name); continue; }
            int64_t numel = w->rows * w->cols;
            double maxerr = 0;
            for (int64_t i = 0; i < numel; i++) {
                float deq = wz->dtype == KN_I8 ? ((const int8_t *)z)[i] * sc[i / 64] : ((const float *)z)[i];
                double e = fabs(deq - x[i]) / (wz->dtype == KN_I8 ? sc[i / 64] + 1e-30 : 1);
                if (e > maxerr) maxerr = e;
            }
            CHECK(maxerr <= 0.5001, "v2 %s layer %d: error %g quantization steps", w->name, l, maxerr);
        }
    }
    kn_llama2c_close(m1);
    kn_llama2c_close(m2);
    /* truncated by 4 bytes, or with 4 extra bytes: refused */
    v1 = realloc(v1, n1 + 4);
    memset(v1 + n1, 0, 4);
    CHECK(kn_llama2c_open_memory(v1, n1 + 4, &m1) == KN_ERR_FORMAT && strstr(kn_last_error(), "implies"), "extra bytes");
    CHECK(kn_llama2c_open_memory(v1, n1 - 4, &m1) == KN_ERR_FORMAT, "truncated v1");
    CHECK(kn_llama2c_open_memory(v2, n2 - 1, &m1) == KN_ERR_FORMAT, "truncated v2");
    free(v1);
    free(v2);
    kn_llama2c_close(m);
}

/* A synthetic legacy checkpoint with value i at float i (for layout checks). */
static float *l2c_legacy(int dim, int hidden, int layers, int heads, int kv, int vocab, int seq, size_t *n) {
    size_t hs = (size_t)(dim / heads), kvd = (size_t)(dim * kv / heads), D = (size_t)dim, V = (size_t)abs(vocab);
    size_t per_layer = 2 * D + 2 * D * D + 2 * kvd * D + 3 * (size_t)hidden * D;
    size_t nf = V * D + (size_t)layers * per_layer + D + (size_t)seq * (hs / 2) * 2 + (vocab < 0 ? V * D : 0);
    float *f = malloc(28 + nf * 4);
    int32_t h[7] = {dim, hidden, layers, heads, kv, vocab, seq};
    memcpy(f, h, 28);
    for (size_t i = 0; i < nf; i++) { float v = (float)i; memcpy((uint8_t *)f + 28 + 4 * i, &v, 4); }
    *n = 28 + nf * 4;
    return f;
}

TEST(llama2c_layouts_and_corruptions) {
    /* unshared classifier (negative vocab): wcls is the last vocab*dim floats */
    size_t n;
    float *f = l2c_legacy(8, 12, 2, 4, 2, -10, 6, &n);
    uint8_t *buf = malloc(n);
    memcpy(buf, f, n);
    kn_llama2c *m;
    REQUIRE(kn_llama2c_open_memory(buf, n, &m) == KN_OK, "%s", kn_last_error());
    const kn_llama2c_config *c = kn_llama2c_config_of(m);
    CHECK(!c->shared_classifier && c->vocab_size == 10 && c->kv_dim == 4, "config");
    const kn_llama2c_weight *wc = kn_llama2c_weight_of(m, KN_L2C_WCLS);
    CHECK(wc->data && (const uint8_t *)wc->data + wc->nbytes == buf + n, "wcls at the end");
    float v;
    memcpy(&v, kn_llama2c_layer(m, KN_L2C_WK, 1, NULL), 4);
    /* floats before wk[1]: emb 80, rms_att 16, wq 128, wk[0] 32 */
    CHECK(v == 80 + 16 + 128 + 32, "wk[1][0] = %g", v);
    memcpy(&v, kn_llama2c_layer(m, KN_L2C_RMS_FINAL, 0, NULL), 4);
    CHECK(v == 80 + 2 * (8 + 64 + 32 + 32 + 64 + 8 + 96 * 3), "rms_final[0] = %g", v);
    kn_llama2c_close(m);
    /* header corruptions */
    static const struct { int field; int32_t val; const char *want; } cases[] = {
        {0, 0, "dim"}, {0, -8, "dim"}, {0, 9, "n_heads"}, {4, 3, "n_kv_heads"}, {4, 8, "n_kv_heads"},
        {2, 3, "implies"}, {5, INT32_MIN, "vocab"}, {6, 7, "implies"}, {1, 1 << 25, "hidden_dim"},
        {2, 1 << 24, "implies"}, {0, 1 << 24, "implies"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, f, n);
        memcpy(buf + 4 * cases[i].field, &cases[i].val, 4);
        kn_llama2c *x = (kn_llama2c *)1;
        kn_status s = kn_llama2c_open_memory(buf, n, &x);
        CHECK(s == KN_ERR_FORMAT && x == NULL, "case %zu must fail", i);
        CHECK(strstr(kn_last_error(), cases[i].want), "case %zu: '%s' lacks '%s'", i, kn_last_error(), cases[i].want);
    }
    for (size_t k = 0; k < 64; k++) CHECK(kn_llama2c_open_memory(buf, k, &m) != KN_OK, "prefix %zu", k);
    /* versioned header corruptions */
    uint8_t hdr[512] = {0};
    put_u32_at(hdr, 0, KN_LLAMA2C_MAGIC);
    put_u32_at(hdr, 4, 3);
    CHECK(kn_llama2c_open_memory(hdr, 512, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "version 3"), "v3");
    put_u32_at(hdr, 4, 2);
    const int32_t hv[7] = {8, 12, 1, 2, 2, 16, 4};
    for (int i = 0; i < 7; i++) put_u32_at(hdr, 8 + 4 * (size_t)i, (uint32_t)hv[i]);
    hdr[36] = 1;
    put_u32_at(hdr, 37, 6);
    CHECK(kn_llama2c_open_memory(hdr, 512, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "group size"), "gs 6");
    put_u32_at(hdr, 37, 8);
    hdr[36] = 2;
    CHECK(kn_llama2c_open_memory(hdr, 512, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "shared"), "flag 2");
    hdr[36] = 1;
    CHECK(kn_llama2c_open_memory(hdr, 200, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "256"), "short header");
    CHECK(kn_llama2c_open_memory(hdr, 512, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "implies"), "size");
    put_u32_at(hdr, 37, 64);   /* wq has 64 values, the embedding 128: fine; w1 has 96: not a multiple */
    CHECK(kn_llama2c_open_memory(hdr, 512, &m) == KN_ERR_FORMAT && strstr(kn_last_error(), "group size"), "gs 64: %s", kn_last_error());
    CHECK(kn_llama2c_open_memory(hdr + 1, 200, &m) == KN_ERR_INVALID, "unaligned memory");
    CHECK(kn_llama2c_open("/nonexistent.bin", &m) == KN_ERR_IO && m == NULL, "missing file");
    kn_llama2c_close(NULL);
    free(buf);
    free(f);
}

/* ---- llm.c GPT-2 -------------------------------------------------------------------- */

TEST(llmc_gpt2_roundtrip) {
    const kn_llmc_gpt2_config cfg = {.max_seq_len = 8, .vocab_size = 10, .padded_vocab_size = 16,
                                     .n_layers = 2, .n_heads = 2, .channels = 8};
    kn_llmc_gpt2_tensor sh[KN_GPT2_NPARAMS];
    int64_t numel;
    REQUIRE(kn_llmc_gpt2_shapes(&cfg, sh, &numel) == KN_OK, "%s", kn_last_error());
    /* wte 128 wpe 64 ln1 16+16 qkvw 384 qkvb 48 attproj 128+16 ln2 32 fcw 512 fcb 64 fcproj 512+16 lnf 16 */
    CHECK(numel == 128 + 64 + 32 + 384 + 48 + 128 + 16 + 32 + 512 + 64 + 512 + 16 + 16, "numel %lld", (long long)numel);
    CHECK(sh[KN_GPT2_QKVW].ndim == 3 && sh[KN_GPT2_QKVW].shape[1] == 24 && sh[KN_GPT2_FCPROJW].shape[2] == 32, "shapes");
    float *params = malloc((size_t)numel * 4);
    kn_test_seed(7);
    kn_test_fill_f32(params, numel, -1, 1);
    char path[] = "/tmp/kn_test_gpt2XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0, "mkstemp");
    close(fd);
    REQUIRE(kn_llmc_gpt2_write_flat(path, &cfg, KN_F32, params) == KN_OK, "%s", kn_last_error());
    kn_llmc_gpt2 *m;
    REQUIRE(kn_llmc_gpt2_open(path, &m) == KN_OK, "%s", kn_last_error());
    const kn_llmc_gpt2_config *c = kn_llmc_gpt2_config_of(m);
    CHECK(c->max_seq_len == 8 && c->vocab_size == 10 && c->padded_vocab_size == 16 && c->n_layers == 2 &&
          c->n_heads == 2 && c->channels == 8, "config");
    CHECK(kn_llmc_gpt2_dtype(m) == KN_F32 && kn_llmc_gpt2_numel(m) == numel, "dtype/numel");
    size_t off = 0;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) {
        const kn_llmc_gpt2_tensor *t = kn_llmc_gpt2_param(m, (kn_gpt2_param)i);
        CHECK(t->nbytes == (size_t)sh[i].numel * 4 && !memcmp(t->data, (const uint8_t *)params + off, t->nbytes),
              "param %s", t->name);
        off += t->nbytes;
    }
    CHECK(kn_llmc_gpt2_param(m, KN_GPT2_NPARAMS) == NULL, "range");
    kn_llmc_gpt2_close(m);
    /* bf16 through the 16-pointer writer */
    uint16_t *bf = malloc((size_t)numel * 2);
    for (int64_t i = 0; i < numel; i++) bf[i] = kn_fp32_to_bf16(params[i]);
    const void *ptrs[KN_GPT2_NPARAMS];
    off = 0;
    for (int i = 0; i < KN_GPT2_NPARAMS; i++) { ptrs[i] = bf + off; off += (size_t)sh[i].numel; }
    REQUIRE(kn_llmc_gpt2_write(path, &cfg, KN_BF16, ptrs) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_llmc_gpt2_open(path, &m) == KN_OK, "%s", kn_last_error());
    CHECK(kn_llmc_gpt2_dtype(m) == KN_BF16, "bf16");
    const kn_llmc_gpt2_tensor *lnfb = kn_llmc_gpt2_param(m, KN_GPT2_LNFB);
    CHECK(!memcmp(lnfb->data, bf + numel - 8, 16), "lnfb bf16");
    kn_llmc_gpt2_close(m);
    /* corruptions, in memory */
    kn_mapfile *mf;
    REQUIRE(kn_mapfile_open(path, &mf) == KN_OK, "%s", kn_last_error());
    uint8_t *img = malloc(mf->size);
    static const struct { size_t at; uint32_t val; const char *want; } cases[] = {
        {0, 20240328, "magic"}, {4, 4, "version 4"}, {4, 3, "implies"}, {20, 3, "NH"}, {28, 9, "Vp"},
        {24, 0, "C ="}, {16, 0x7fffffff, "L ="}, {16, 1 << 24, "implies"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(img, mf->data, mf->size);
        put_u32_at(img, cases[i].at, cases[i].val);
        kn_llmc_gpt2 *x = (kn_llmc_gpt2 *)1;
        CHECK(kn_llmc_gpt2_open_memory(img, mf->size, &x) == KN_ERR_FORMAT && x == NULL, "case %zu", i);
        CHECK(strstr(kn_last_error(), cases[i].want), "case %zu: '%s' lacks '%s'", i, kn_last_error(), cases[i].want);
    }
    memcpy(img, mf->data, mf->size);
    CHECK(kn_llmc_gpt2_open_memory(img, mf->size - 2, &m) == KN_ERR_FORMAT, "truncated");
    CHECK(kn_llmc_gpt2_open_memory(img, 1000, &m) == KN_ERR_FORMAT, "short header");
    CHECK(kn_llmc_gpt2_write(path, &cfg, KN_F16, ptrs) == KN_ERR_INVALID, "f16 refused");
    kn_llmc_gpt2_close(NULL);
    free(img);
    kn_mapfile_close(mf);
    remove(path);
    free(bf);
    free(params);
}

KN_TEST_MAIN()
