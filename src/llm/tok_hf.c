/* tok_hf.c: runs a Hugging Face tokenizer.json pipeline (tok_hf.h) on one run
 * of text between added tokens: normalizers, then pre-tokenizers, then the
 * model (BPE, WordPiece or Unigram) on each piece.
 *
 * The algorithms follow the `tokenizers` library's documented behaviour:
 *   BPE       - each character is a symbol (missing: its <0xNN> byte tokens
 *               with byte_fallback, else the unknown token, consecutive ones
 *               fused with fuse_unk, else dropped); then the adjacent pair
 *               with the lowest merge rank merges, leftmost first, until no
 *               pair has a rank. ignore_merges: a piece that is a vocabulary
 *               entry as a whole is that entry.
 *   WordPiece - greedy longest match from the left; later sub-words carry the
 *               "##" prefix; a word that cannot be covered, or is longer than
 *               max_input_chars_per_word characters, is one unknown token.
 *   Unigram   - Viterbi over byte positions: each vocabulary piece starting at
 *               a position extends the best path ending there by its score;
 *               a character no piece of one character covers becomes the
 *               unknown token at (lowest score - 10); ties keep the earlier
 *               candidate. Consecutive unknowns fuse; with byte_fallback an
 *               unknown run becomes its <0xNN> tokens.
 * Non-goals: offsets, truncation, padding, post-processors (pairs, templates),
 * BPE dropout. BertNormalizer's strip_accents is NFD then dropping Mn marks,
 * done per character here: the canonical reordering of NFD can only move
 * marks, and the Mn ones are dropped anyway (kept Mc/Me marks are not
 * reordered). NFC/NFKC are applied only to text they leave unchanged (no
 * character that normalization may alter or combine, tok_hfuni.c); other
 * input is refused with KN_ERR_UNSUPPORTED naming the character.
 */
#include "llm/tok_hf.h"   /* defines: struct kn_hf, kn__hf_* helpers */
#include <stdlib.h>
#include <string.h>

/* ========================================================================== */
/* growable strings and piece lists                                           */
/* ========================================================================== */

typedef struct sbuf { char *p; size_t n, cap; } sbuf;
typedef struct span { size_t off, len; } span;
typedef struct pvec { span *v; size_t n, cap; } pvec;

static kn_status nomem(void) {
    return kn_set_error(KN_ERR_NOMEM, "tokenize: out of memory in the tokenizer.json pipeline");
}

static kn_status sb_put(sbuf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return nomem();
        b->p = np; b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    return KN_OK;
}

static kn_status sb_cp(sbuf *b, uint32_t cp) {
    char u[4];
    return sb_put(b, u, (size_t)kn__utf8_encode(cp, u));
}

/* Close the piece that started at byte `from` of b (empty pieces are dropped,
 * as the library drops empty splits). */
static kn_status pv_close(pvec *pv, const sbuf *b, size_t from) {
    if (b->n == from) return KN_OK;
    if (pv->n == pv->cap) {
        size_t nc = pv->cap ? pv->cap * 2 : 16;
        span *nv = realloc(pv->v, nc * sizeof *nv);
        if (!nv) return nomem();
        pv->v = nv; pv->cap = nc;
    }
    pv->v[pv->n++] = (span){from, b->n - from};
    return KN_OK;
}

static uint32_t cp_at(const char *s, size_t n, size_t i, int *k) {
    uint32_t cp;
    *k = kn__utf8_decode((const unsigned char *)s + i, n - i, &cp);
    return cp;
}

static bool is_ws(uint32_t c) { return kn__cp_class(c) == KN_CF_SPACE; }

/* ========================================================================== */
/* normalizers: src -> dst                                                    */
/* ========================================================================== */

static kn_status norm_one(const kn_hf_norm *nm, const char *s, size_t n, sbuf *d) {
    kn_status st = KN_OK;
    int k;
    bool prev_ccc = false;
    switch (nm->type) {
    case KN_HFN_NFC: case KN_HFN_NFKC:
        for (size_t i = 0; i < n; i += (size_t)k) {
            uint32_t c = cp_at(s, n, i, &k);
            bool ccc = kn__hf_is_ccc(c), two = ccc && prev_ccc;
            prev_ccc = ccc;
            if (two || kn__hf_nf_unsafe(c, nm->type == KN_HFN_NFKC))
                return kn_set_error(KN_ERR_UNSUPPORTED, "tokenize: the tokenizer's %s normalizer is only "
                                    "implemented for text that it leaves unchanged, and U+%04X (byte offset "
                                    "%zu of the run) may change; normalize the text to %s before tokenizing",
                                    nm->type == KN_HFN_NFC ? "NFC" : "NFKC", (unsigned)c, i,
                                    nm->type == KN_HFN_NFC ? "NFC" : "NFKC");
        }
        return sb_put(d, s, n);
    case KN_HFN_LOWERCASE:
        for (size_t i = 0; i < n && st == KN_OK; i += (size_t)k) {
            uint32_t lo[3], c = cp_at(s, n, i, &k);
            int m = kn__hf_lower(c, lo);
            for (int j = 0; j < m && st == KN_OK; j++) st = sb_cp(d, lo[j]);
        }
        return st;
    case KN_HFN_STRIP: {
        size_t b = 0, e = n;
        if (nm->left) while (b < e) { uint32_t c = cp_at(s, n, b, &k); if (!is_ws(c)) break; b += (size_t)k; }
        if (nm->right) while (e > b) {
            size_t q = e - 1;
            while (q > b && ((unsigned char)s[q] & 0xC0) == 0x80) q--;
            uint32_t c = cp_at(s, n, q, &k);
            if (!is_ws(c)) break;
            e = q;
        }
        return sb_put(d, s + b, e - b);
    }
    case KN_HFN_REPLACE:
        for (size_t i = 0; i < n && st == KN_OK;) {
            if (nm->na && i + nm->na <= n && memcmp(s + i, nm->a, nm->na) == 0) {
                st = sb_put(d, nm->b, nm->nb); i += nm->na;
            } else { st = sb_put(d, s + i, 1); i++; }
        }
        return st;
    case KN_HFN_PREPEND:
        if (n > 0) st = sb_put(d, nm->a, nm->na);
        return st == KN_OK ? sb_put(d, s, n) : st;
    case KN_HFN_BERT:
        for (size_t i = 0; i < n && st == KN_OK; i += (size_t)k) {
            uint32_t c = cp_at(s, n, i, &k);
            if (nm->clean) {
                if (c == 0 || c == 0xFFFD || kn__hf_is_other(c)) continue;
                if (is_ws(c)) c = ' ';
            }
            bool cjk = nm->chinese && kn__hf_is_chinese(c);
            if (cjk) st = sb_put(d, " ", 1);
            uint32_t sa[3]; int ns = 1;
            sa[0] = c;
            if (nm->strip) ns = kn__hf_strip_accents(c, sa);   /* per character: see the header */
            for (int q = 0; q < ns && st == KN_OK; q++) {
                if (nm->lower) {
                    uint32_t lo[3]; int m = kn__hf_lower(sa[q], lo);
                    for (int j = 0; j < m && st == KN_OK; j++) st = sb_cp(d, lo[j]);
                } else st = sb_cp(d, sa[q]);
            }
            if (cjk && st == KN_OK) st = sb_put(d, " ", 1);
        }
        return st;
    }
    return kn_set_error(KN_ERR_INVALID, "tokenize: bad normalizer");
}

/* ========================================================================== */
/* pre-tokenizers: one piece of src -> pieces appended to d / pv              */
/* ========================================================================== */

typedef struct split_ctx { const char *s; sbuf *d; pvec *pv; bool bytes; } split_ctx;

static kn_status split_emit(void *ctx, size_t off, size_t len) {
    split_ctx *c = ctx;
    size_t from = c->d->n;
    kn_status st = KN_OK;
    if (c->bytes) {     /* ByteLevel: each byte becomes its printable stand-in */
        for (size_t i = 0; i < len && st == KN_OK; i++) st = sb_cp(c->d, kn__byte_to_cp((unsigned char)c->s[off + i]));
    } else st = sb_put(c->d, c->s + off, len);
    return st == KN_OK ? pv_close(c->pv, c->d, from) : st;
}

/* Cut s into runs of characters of equal class(c) (class 0: dropped; class
 * 1: each character alone; others: maximal runs). */
static kn_status split_classes(const char *s, size_t n, sbuf *d, pvec *pv, int (*cls)(uint32_t, const kn_hf_pre *),
                               const kn_hf_pre *p) {
    kn_status st = KN_OK;
    size_t from = d->n; int prev = -1, k;
    for (size_t i = 0; i < n && st == KN_OK; i += (size_t)k) {
        uint32_t c = cp_at(s, n, i, &k);
        int x = cls(c, p);
        if (x != prev || x == 1) { st = pv_close(pv, d, from); from = d->n; }
        if (st == KN_OK && x != 0) st = sb_put(d, s + i, (size_t)k);
        prev = x;
    }
    return st == KN_OK ? pv_close(pv, d, from) : st;
}

static int cls_bert(uint32_t c, const kn_hf_pre *p) {
    (void)p;
    return is_ws(c) ? 0 : kn__hf_is_punct(c) ? 1 : 2;
}
static int cls_punct(uint32_t c, const kn_hf_pre *p) { (void)p; return kn__hf_is_punct(c) ? 1 : 2; }
static int cls_wssplit(uint32_t c, const kn_hf_pre *p) { (void)p; return is_ws(c) ? 0 : 2; }
static int cls_digits(uint32_t c, const kn_hf_pre *p) {
    return kn__cp_class(c) == KN_CF_NUMBER ? (p->individual ? 1 : 3) : 2;
}
/* \w+|[^\w\s]+ with \w as letters, numbers, marks and '_' (the regex
 * crate's \w also holds a few other connector punctuation characters) */
static int cls_whitespace(uint32_t c, const kn_hf_pre *p) {
    (void)p;
    unsigned f = kn__cp_class(c);
    if (f == KN_CF_SPACE) return 0;
    if (f == KN_CF_LETTER || f == KN_CF_NUMBER || c == '_' || kn__hf_is_mark(c)) return 2;
    return 3;
}

static kn_status pre_one(const kn_hf_pre *p, const char *s, size_t n, bool first, sbuf *d, pvec *pv) {
    kn_status st = KN_OK;
    switch (p->type) {
    case KN_HFP_BYTELEVEL: {
        sbuf tmp = {0};
        if (p->add_prefix_space && (n == 0 || s[0] != ' ')) {
            st = sb_put(&tmp, " ", 1);
            if (st == KN_OK) st = sb_put(&tmp, s, n);
            if (st != KN_OK) { free(tmp.p); return st; }
            s = tmp.p; n = tmp.n;
        }
        split_ctx c = {s, d, pv, true};
        st = p->use_regex ? kn__pretok_split(KN_PRETOK_GPT2, s, n, split_emit, &c) : split_emit(&c, 0, n);
        free(tmp.p);
        return st;
    }
    case KN_HFP_SPLIT: {
        split_ctx c = {s, d, pv, false};
        return kn__pretok_split(p->pattern, s, n, split_emit, &c);
    }
    case KN_HFP_METASPACE: {
        size_t from = d->n;
        bool pre = (p->prepend == KN_HF_PREPEND_ALWAYS || (p->prepend == KN_HF_PREPEND_FIRST && first)) &&
                   !(n > 0 && s[0] == ' ') && !(n >= p->na && memcmp(s, p->a, p->na) == 0);   /* after replacing */
        if (pre) st = sb_put(d, p->a, p->na);
        for (size_t i = 0; i < n && st == KN_OK; i++) {
            if (s[i] == ' ') {
                if (p->split) { st = pv_close(pv, d, from); from = d->n; }
                if (st == KN_OK) st = sb_put(d, p->a, p->na);
            } else if (p->split && n - i >= p->na && memcmp(s + i, p->a, p->na) == 0) {
                st = pv_close(pv, d, from); from = d->n;
                if (st == KN_OK) st = sb_put(d, p->a, p->na);
                i += p->na - 1;
            } else st = sb_put(d, s + i, 1);
        }
        return st == KN_OK ? pv_close(pv, d, from) : st;
    }
    case KN_HFP_SPLITSTR: {             /* occurrences of p->a, leftmost first, not overlapping */
        size_t from = d->n;
        bool prev_hit = false;
        for (size_t i = 0; i < n && st == KN_OK;) {
            bool hit = n - i >= p->na && memcmp(s + i, p->a, p->na) == 0;
            if (!hit) {
                if (prev_hit && p->behavior == KN_HF_SPLIT_CONTIGUOUS) { st = pv_close(pv, d, from); from = d->n; }
                if (st == KN_OK) st = sb_put(d, s + i, 1);
                i++;
            } else {
                switch (p->behavior) {
                case KN_HF_SPLIT_REMOVED: st = pv_close(pv, d, from); break;
                case KN_HF_SPLIT_ISOLATED:
                    st = pv_close(pv, d, from);
                    from = d->n;
                    if (st == KN_OK) st = sb_put(d, p->a, p->na);
                    if (st == KN_OK) st = pv_close(pv, d, from);
                    break;
                case KN_HF_SPLIT_PREV: st = sb_put(d, p->a, p->na); if (st == KN_OK) st = pv_close(pv, d, from); break;
                case KN_HF_SPLIT_NEXT: st = pv_close(pv, d, from); from = d->n; if (st == KN_OK) st = sb_put(d, p->a, p->na); break;
                default:                  /* contiguous: a run of delimiters is one piece */
                    if (!prev_hit) { st = pv_close(pv, d, from); from = d->n; }
                    if (st == KN_OK) st = sb_put(d, p->a, p->na);
                }
                if (p->behavior != KN_HF_SPLIT_NEXT && p->behavior != KN_HF_SPLIT_CONTIGUOUS) from = d->n;
                i += p->na;
            }
            prev_hit = hit;
        }
        return st == KN_OK ? pv_close(pv, d, from) : st;
    }
    case KN_HFP_WHITESPACE: return split_classes(s, n, d, pv, cls_whitespace, p);
    case KN_HFP_WSSPLIT:    return split_classes(s, n, d, pv, cls_wssplit, p);
    case KN_HFP_BERT:       return split_classes(s, n, d, pv, cls_bert, p);
    case KN_HFP_DIGITS:     return split_classes(s, n, d, pv, cls_digits, p);
    case KN_HFP_PUNCT:      return split_classes(s, n, d, pv, cls_punct, p);
    }
    return kn_set_error(KN_ERR_INVALID, "tokenize: bad pre-tokenizer");
}

/* ========================================================================== */
/* models                                                                     */
/* ========================================================================== */

static int32_t model_lookup(const kn_tokenizer *t, const char *s, size_t n) {
    int32_t id = kn__tok_lookup(t, s, n);
    return id >= 0 && t->hf->in_model[id] ? id : -1;   /* added tokens outside it are not the model's */
}

typedef struct enc {
    const kn_tokenizer *t;
    const struct kn_hf *hf;
    kn_idvec *out;
    kn_bpe_sym *sy; size_t sy_cap;
    kn_heap heap;
    sbuf tmp;
    double *vs; int32_t *vid; size_t *vfrom; size_t v_cap;   /* Viterbi: [n + 1] each */
} enc;

static kn_status sym_reserve(enc *e, size_t n) {
    if (n <= e->sy_cap) return KN_OK;
    kn_bpe_sym *ns = realloc(e->sy, n * sizeof *ns);
    if (!ns) return nomem();
    e->sy = ns; e->sy_cap = n;
    return KN_OK;
}

static kn_status bpe_piece(enc *e, const char *s, size_t n) {
    const kn_tokenizer *t = e->t; const struct kn_hf *hf = e->hf;
    if (hf->ignore_merges) {
        int32_t id = model_lookup(t, s, n);
        if (id >= 0) return kn__idvec_push(e->out, id);
    }
    kn_status st = sym_reserve(e, n);
    if (st != KN_OK) return st;
    kn_bpe_sym *sy = e->sy;
    size_t m = 0; int k;
    bool last_unk = false;
    for (size_t i = 0; i < n; i += (size_t)k) {
        uint32_t c = cp_at(s, n, i, &k);
        (void)c;
        int32_t id = model_lookup(t, s + i, (size_t)k);
        if (id >= 0) { sy[m++].id = id; last_unk = false; continue; }
        if (hf->byte_fallback) {
            bool all = true;
            for (int j = 0; j < k; j++) all = all && hf->byte_tok[(unsigned char)s[i + (size_t)j]] >= 0;
            if (all) {
                for (int j = 0; j < k; j++) sy[m++].id = hf->byte_tok[(unsigned char)s[i + (size_t)j]];
                last_unk = false;
                continue;
            }
        }
        if (hf->unk < 0) continue;                        /* no unknown token: dropped */
        if (hf->fuse_unk && last_unk) continue;
        sy[m++].id = hf->unk; last_unk = true;
    }
    return kn__bpe_merge_syms(t, sy, m, &e->heap, e->out);
}

static kn_status wordpiece_piece(enc *e, const char *s, size_t n) {
    const kn_tokenizer *t = e->t; const struct kn_hf *hf = e->hf;
    size_t nch = 0; int k;
    for (size_t i = 0; i < n; i += (size_t)k) { cp_at(s, n, i, &k); nch++; }
    size_t mark = e->out->n;
    if ((int64_t)nch <= hf->max_chars) {
        size_t start = 0;
        while (start < n) {
            int32_t found = -1;
            size_t end = n - start > hf->max_piece ? start + hf->max_piece : n;   /* longer: in no entry */
            while (end < n && ((unsigned char)s[end] & 0xC0) == 0x80) end--;
            while (end > start) {
                e->tmp.n = 0;
                kn_status st = start > 0 ? sb_put(&e->tmp, hf->prefix, hf->nprefix) : KN_OK;
                if (st == KN_OK) st = sb_put(&e->tmp, s + start, end - start);
                if (st != KN_OK) return st;
                found = model_lookup(t, e->tmp.p, e->tmp.n);
                if (found >= 0) break;
                do end--; while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80);
            }
            if (found < 0) break;
            kn_status st = kn__idvec_push(e->out, found);
            if (st != KN_OK) return st;
            start = end;
        }
        if (start == n) return KN_OK;
    }
    e->out->n = mark;                                     /* whole word unknown */
    if (hf->unk < 0)
        return kn_set_error(KN_ERR_INVALID, "tokenize: WordPiece cannot cover a word and the tokenizer has "
                            "no unk_token; use a tokenizer.json whose model names one");
    return kn__idvec_push(e->out, hf->unk);
}

static kn_status unigram_emit(enc *e, const char *s, size_t n) {
    const struct kn_hf *hf = e->hf;
    int32_t id = model_lookup(e->t, s, n);
    if (id >= 0) return kn__idvec_push(e->out, id);
    if (hf->byte_fallback) {
        bool all = true;
        for (size_t j = 0; j < n; j++) all = all && hf->byte_tok[(unsigned char)s[j]] >= 0;
        if (all) {
            kn_status st = KN_OK;
            for (size_t j = 0; j < n && st == KN_OK; j++) st = kn__idvec_push(e->out, hf->byte_tok[(unsigned char)s[j]]);
            return st;
        }
    }
    if (hf->unk < 0)
        return kn_set_error(KN_ERR_INVALID, "tokenize: Unigram cannot cover the text and the tokenizer has no "
                            "unk_id; use a tokenizer.json whose model names one");
    return kn__idvec_push(e->out, hf->unk);
}

static kn_status unigram_piece(enc *e, const char *s, size_t n) {
    const kn_tokenizer *t = e->t; const struct kn_hf *hf = e->hf;
    if (n + 1 > e->v_cap) {
        free(e->vs); free(e->vid); free(e->vfrom);
        e->vs = malloc((n + 1) * sizeof *e->vs); e->vid = malloc((n + 1) * sizeof *e->vid);
        e->vfrom = malloc((n + 1) * sizeof *e->vfrom);
        e->v_cap = n + 1;
        if (!e->vs || !e->vid || !e->vfrom) { e->v_cap = 0; return nomem(); }
    }
    double *vs = e->vs; int32_t *vid = e->vid; size_t *vfrom = e->vfrom;
    const size_t NONE = SIZE_MAX;
    for (size_t i = 0; i <= n; i++) { vs[i] = 0; vid[i] = -1; vfrom[i] = NONE; }
    int k;
    for (size_t at = 0; at < n; at += (size_t)k) {
        cp_at(s, n, at, &k);
        if (at > 0 && vfrom[at] == NONE) continue;        /* unreachable (cannot happen: unk covers all) */
        double base = vs[at];
        bool single = false;
        int kk;
        for (size_t end = at + (size_t)k; end <= n && end - at <= hf->max_piece; end += (size_t)kk) {
            int32_t id = model_lookup(t, s + at, end - at);
            if (id >= 0) {
                double cand = base + hf->score[id];
                if (vfrom[end] == NONE || cand > vs[end]) { vs[end] = cand; vfrom[end] = at; vid[end] = id; }
                if (end - at == (size_t)k) single = true;
            }
            if (end == n) break;
            cp_at(s, n, end, &kk);
        }
        if (!single) {
            size_t end = at + (size_t)k;
            double cand = base + hf->unk_score;
            if (vfrom[end] == NONE || cand > vs[end]) { vs[end] = cand; vfrom[end] = at; vid[end] = hf->unk; }
        }
    }
    /* back-track into (start, end) pairs, then emit in order, fusing unknowns */
    size_t cnt = 0;
    for (size_t end = n; end > 0; end = vfrom[end]) {
        if (vfrom[end] == NONE) return kn_set_error(KN_ERR_INVALID, "tokenize: Unigram found no path over the text");
        cnt++;
    }
    size_t *cut = malloc((cnt + 1) * sizeof *cut);
    if (!cut) return nomem();
    size_t j = cnt;
    cut[j] = n;
    for (size_t end = n; end > 0; end = vfrom[end]) cut[--j] = vfrom[end];
    kn_status st = KN_OK;
    for (size_t i = 0; i < cnt && st == KN_OK;) {
        size_t b = cut[i], en = cut[i + 1];
        bool unk = hf->unk >= 0 && vid[en] == hf->unk;
        i++;
        if (unk) while (i < cnt && vid[cut[i + 1]] == hf->unk) { en = cut[i + 1]; i++; }
        st = unigram_emit(e, s + b, en - b);
    }
    free(cut);
    return st;
}

/* ========================================================================== */
/* the pipeline                                                               */
/* ========================================================================== */

kn_status kn__hf_encode(const kn_tokenizer *t, const char *text, size_t len, bool at_start, kn_idvec *out) {
    const struct kn_hf *hf = t->hf;
    sbuf a = {0}, b = {0};
    pvec pa = {0}, pb = {0};
    enc e = {t, hf, out, NULL, 0, {0}, {0}, NULL, NULL, NULL, 0};
    kn_status st = sb_put(&a, text, len);
    for (int i = 0; i < hf->n_norm && st == KN_OK; i++) {
        b.n = 0;
        st = norm_one(&hf->norm[i], a.p, a.n, &b);
        sbuf x = a; a = b; b = x;
    }
    if (st == KN_OK) st = pv_close(&pa, &a, 0);
    for (int i = 0; i < hf->n_pre && st == KN_OK; i++) {
        b.n = 0; pb.n = 0;
        for (size_t j = 0; j < pa.n && st == KN_OK; j++)
            st = pre_one(&hf->pre[i], a.p + pa.v[j].off, pa.v[j].len, at_start && j == 0, &b, &pb);
        sbuf x = a; a = b; b = x;
        pvec y = pa; pa = pb; pb = y;
    }
    for (size_t j = 0; j < pa.n && st == KN_OK; j++) {
        const char *s = a.p + pa.v[j].off; size_t n = pa.v[j].len;
        if (hf->model == KN_HFM_BPE) st = bpe_piece(&e, s, n);
        else if (hf->model == KN_HFM_WORDPIECE) st = wordpiece_piece(&e, s, n);
        else st = unigram_piece(&e, s, n);
    }
    free(a.p); free(b.p); free(pa.v); free(pb.v);
    free(e.sy); free(e.heap.v); free(e.tmp.p); free(e.vs); free(e.vid); free(e.vfrom);
    return st;
}
