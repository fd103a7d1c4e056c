/* kiln_chat.h: chat templates: turn a conversation into the prompt text a
 * chat model was trained on.
 *
 * A model's own template (GGUF tokenizer.chat_template; in a Hugging Face
 * directory chat_template.jinja or tokenizer_config.json's chat_template)
 * runs through kiln's Jinja-subset
 * interpreter (src/llm/jinja_*.c), which renders what transformers'
 * apply_chat_template renders, byte for byte (tests/test_chat.c checks the
 * real templates of Llama 3.2, Qwen2.5, Qwen3, Mistral Nemo and 7B v0.2,
 * Gemma 2, Gemma 3, Phi-3.5, SmolLM2, DeepSeek Coder and Command R+: system prompts, several
 * turns, tools, tool calls and results,
 * reasoning; scripts/chat_template_diff.py compares random conversations
 * and random template snippets with jinja2). It knows
 * if/elif/else, for (loop.*, `if` filters, else, break/continue), set (also
 * namespace() attributes), macros (parameters with defaults), expressions with Python semantics (slices, `in`,
 * ~, conditional expressions), the filters, tests and string/dict methods
 * chat templates use, raise_exception, strftime_now, namespace, range.
 * A template using something else (call blocks, includes, an unknown filter) is
 * refused when compiled, with its line:column and the feature's name; a
 * template's raise_exception("...") becomes a KN_ERR_INVALID whose message
 * is the template's. Limits (parser nesting 200, evaluation depth 1000,
 * 2M steps (loop iterations, calls, 256-byte blocks of text processed),
 * 128 MiB of values, 16 MiB of output, 4 MiB of template) stop
 * hostile templates with KN_ERR_INVALID naming the limit (KN_ERR_LIMIT
 * always means "the buffer is too small").
 *
 * Built-in families (kn_chat_template_from_name; `--chat-template`) are
 * written in C, for models without a template:
 *   chatml:  <|im_start|>{role}\n{content}<|im_end|>\n ...  [<|im_start|>assistant\n]
 *   smollm:  chatml with SmolLM2's default system prompt
 *   llama3:  <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|> ...
 *   llama2:  [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
 *   plain:   "Role: content" lines, the turn opened with "Assistant:"
 *
 * BOS: templates usually write {{ bos_token }} first. kn_chat_apply (and
 * kn_chat_apply_json unless keep_bos) drops a leading bos_token from the
 * output when the template mentions bos_token (SmolLM2's bos_token is
 * <|im_start|>, which its template writes literally: that stays), so
 * tokenize the prompt with add_bos = kn_tokenizer_add_bos(tok) and
 * parse_special = true. bos_token/eos_token come from the GGUF
 * (kn_chat_template_from_gguf) or kn_chat_template_set_tokens.
 *
 * Thread safety: a template is immutable after it is made; kn_chat_apply and
 * kn_chat_apply_json may run on one template from many threads at once. A
 * render at the evaluator's depth limit uses about 0.5 MiB of stack (the
 * default thread stack is 8 MiB).
 *
 * Usage:
 *   kn_chat_tmpl tmpl;
 *   if (kn_chat_template_from_gguf(g, &tmpl) != KN_OK)        // or _from_string / _from_name
 *       { fprintf(stderr, "%s\n", kn_last_error()); ... }
 *   kn_chat_msg msgs[] = {{"user", "What is the capital of France?"}};
 *   size_t need;
 *   kn_chat_apply(&tmpl, msgs, 1, true, NULL, 0, &need);      // KN_ERR_LIMIT, need set
 *   char *prompt = malloc(need + 1);
 *   kn_chat_apply(&tmpl, msgs, 1, true, prompt, need + 1, &need);
 *   ...
 *   kn_chat_tmpl_free(&tmpl);
 */
#ifndef KILN_CHAT_H
#define KILN_CHAT_H
#pragma GCC visibility push(default)   /* what libkiln.so exports: the kn_ API (the rest is built -fvisibility=hidden) */
#include "kiln_base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kn_gguf;

typedef enum kn_chat_format {
    KN_CHAT_CHATML = 1,
    KN_CHAT_LLAMA2 = 2,
    KN_CHAT_LLAMA3 = 3,
    KN_CHAT_PLAIN = 4,          /* "User: text" lines, no special tokens: for base models and the
                                 * models `kiln train` makes (their vocabulary has no markers) */
    KN_CHAT_JINJA = 5,          /* a template compiled by the interpreter (prog)                 */
} kn_chat_format;

typedef struct kn_chat_tmpl {
    kn_chat_format format;
    char default_system[512];   /* ChatML family: system prompt used when none is given ("" = none) */
    void *prog;                 /* KN_CHAT_JINJA: the compiled template, owned (kn_chat_tmpl_free) */
    char bos_token[128];        /* the template's bos_token / eos_token ("" = undefined)          */
    char eos_token[128];
} kn_chat_tmpl;

typedef struct kn_chat_msg {
    const char *role;           /* "system", "user", "assistant" (ChatML/Llama 3: any role) */
    const char *content;        /* NUL-terminated UTF-8                                      */
} kn_chat_msg;

/* Compile a Jinja chat template. KN_ERR_FORMAT for a syntax error,
 * KN_ERR_UNSUPPORTED for a feature the interpreter lacks (both name the
 * line:column; the message suggests --chat-template chatml|llama2|llama3|
 * smollm|plain). On success *out owns memory: call kn_chat_tmpl_free. */
kn_status kn_chat_template_from_string(const char *jinja, kn_chat_tmpl *out);
/* From a GGUF's tokenizer.chat_template (KN_ERR_UNSUPPORTED if it has none),
 * with bos_token/eos_token from tokenizer.ggml.{bos,eos}_token_id. */
kn_status kn_chat_template_from_gguf(const struct kn_gguf *g, kn_chat_tmpl *out);
/* By name: "chatml", "llama2", "llama3" (no default system prompt),
 * "smollm" (ChatML with SmolLM2's default system prompt), or "plain" (each
 * message as "Role: content" on its own line, the turn opened with
 * "Assistant:"). */
kn_status kn_chat_template_from_name(const char *name, kn_chat_tmpl *out);
/* The built-in family a template's marker tokens point to ("<|im_start|>":
 * chatml, "<|start_header_id|>": llama3, "[INST]": llama2), for a fallback
 * when kn_chat_template_from_string refuses the template; KN_ERR_UNSUPPORTED
 * when there is none. The family renders plain text turns only and knows no
 * default system prompt. */
kn_status kn_chat_template_family_of(const char *jinja, kn_chat_tmpl *out);
/* Set the bos_token / eos_token a template sees (NULL or "" = undefined);
 * KN_ERR_LIMIT if one is longer than 127 bytes. */
kn_status kn_chat_template_set_tokens(kn_chat_tmpl *tmpl, const char *bos, const char *eos);

/* Releases what a template owns (the compiled program). Always call it when
 * done; a zeroed or freed template is safe to free again. */
void kn_chat_tmpl_free(kn_chat_tmpl *tmpl);

/* Render n messages. add_generation_prompt appends the opening of the
 * assistant's turn. Writes a NUL-terminated string when it fits; *needed
 * gets the length without the NUL. Returns KN_ERR_LIMIT if cap < *needed + 1
 * (buf may be NULL with cap 0 to measure), KN_ERR_INVALID for a NULL role or
 * content, (Llama 2) roles that do not alternate, or a template's
 * raise_exception; other errors of the template as kn_chat_apply_json. */
kn_status kn_chat_apply(const kn_chat_tmpl *tmpl, const kn_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, char *buf, size_t cap, size_t *needed);

/* A conversation as OpenAI-style JSON text (what a server receives), for
 * templates with tools, tool calls and multi-part content. */
typedef struct kn_chat_request {
    const char *messages_json;  /* array of {"role", "content" (string, array of parts, or null),
                                 * optional "tool_calls", "tool_call_id", "name", "reasoning_content"} */
    const char *tools_json;     /* NULL, or an array of tool definitions, e.g.
                                 * [{"type":"function","function":{"name":..,"description":..,"parameters":{..}}}] */
    const char *extra_json;     /* NULL, or an object whose members become template variables
                                 * (e.g. {"enable_thinking": false, "date_string": "26 Jul 2024"})  */
    bool add_generation_prompt;
    bool keep_bos;              /* keep a leading bos_token, as transformers prints it            */
    bool parse_arguments;       /* tool_calls[].function.arguments given as a JSON string (OpenAI's
                                 * form) are parsed into objects first, as the templates expect   */
} kn_chat_request;

/* Render a request as transformers' apply_chat_template(messages, tools=...,
 * add_generation_prompt=..., **extra) does: message members whose value is
 * null are dropped, reasoning_content/thinking/reasoning are aliased to each
 * other; the template sees messages, tools (none when absent), documents
 * (none), add_generation_prompt, bos_token, eos_token and the extra
 * members. Output and KN_ERR_LIMIT as kn_chat_apply. KN_ERR_FORMAT for
 * malformed JSON; the built-in families take text-only messages and no tools
 * (KN_ERR_UNSUPPORTED otherwise). */
kn_status kn_chat_apply_json(const kn_chat_tmpl *tmpl, const kn_chat_request *req,
                             char *buf, size_t cap, size_t *needed);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
