/* kiln_chat.h: chat templates: turn a list of (role, content) messages into
 * the prompt text a chat model was trained on.
 *
 * kiln does not run Jinja. It recognises the common template families in a
 * GGUF's tokenizer.chat_template string and renders them in C:
 *   ChatML  (template contains "<|im_start|>"; SmolLM2, Qwen, ...):
 *       <|im_start|>{role}\n{content}<|im_end|>\n ...  [<|im_start|>assistant\n]
 *       A default system prompt written in the template (SmolLM2: "You are a
 *       helpful AI assistant named SmolLM, trained by Hugging Face") is used
 *       when the first message is not a system message.
 *   Llama 3 (contains "<|start_header_id|>"):
 *       <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
 *       ...  [<|start_header_id|>assistant<|end_header_id|>\n\n]
 *   Llama 2 (contains "[INST]"):
 *       [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] {user} [/INST]
 *       (contents trimmed; roles must alternate user/assistant after an
 *       optional first system message; there is no generation prompt).
 * The rendered text never begins with the BOS token, which the templates
 * write as their first characters: tokenize it with
 * add_bos = kn_tokenizer_add_bos(tok) and parse_special = true.
 *
 * Usage:
 *   kn_chat_tmpl tmpl;
 *   if (kn_chat_template_from_gguf(g, &tmpl) != KN_OK)        // or _from_name("chatml")
 *       { fprintf(stderr, "%s\n", kn_last_error()); ... }
 *   kn_chat_msg msgs[] = {{"user", "What is the capital of France?"}};
 *   size_t need;
 *   kn_chat_apply(&tmpl, msgs, 1, true, NULL, 0, &need);      // KN_ERR_LIMIT, need set
 *   char *prompt = malloc(need + 1);
 *   kn_chat_apply(&tmpl, msgs, 1, true, prompt, need + 1, &need);
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
} kn_chat_format;

typedef struct kn_chat_tmpl {
    kn_chat_format format;
    char default_system[512];   /* ChatML: system prompt used when none is given ("" = none) */
} kn_chat_tmpl;

typedef struct kn_chat_msg {
    const char *role;           /* "system", "user", "assistant" (ChatML/Llama 3: any role) */
    const char *content;        /* NUL-terminated UTF-8                                      */
} kn_chat_msg;

/* Recognise a Jinja chat template. KN_ERR_UNSUPPORTED (with a hint to pass
 * --chat-template chatml|llama2|llama3) when it is none of the families. */
kn_status kn_chat_template_from_string(const char *jinja, kn_chat_tmpl *out);
/* From a GGUF's tokenizer.chat_template (KN_ERR_UNSUPPORTED if it has none). */
kn_status kn_chat_template_from_gguf(const struct kn_gguf *g, kn_chat_tmpl *out);
/* By name: "chatml", "llama2", "llama3" (no default system prompt),
 * "smollm" (ChatML with SmolLM2's default system prompt), or "plain" (each
 * message as "Role: content" on its own line, the turn opened with
 * "Assistant:"). */
kn_status kn_chat_template_from_name(const char *name, kn_chat_tmpl *out);

/* Releases what a template owns (nothing for the built-in families; a
 * compiled Jinja program once the interpreter lands). Always call it when
 * done; a zeroed or freed template is safe to free again. */
void kn_chat_tmpl_free(kn_chat_tmpl *tmpl);

/* Render n messages. add_generation_prompt appends the opening of the
 * assistant's turn. Writes a NUL-terminated string when it fits; *needed
 * gets the length without the NUL. Returns KN_ERR_LIMIT if cap < *needed + 1
 * (buf may be NULL with cap 0 to measure), KN_ERR_INVALID for a NULL role or
 * content, or (Llama 2) roles that do not alternate. */
kn_status kn_chat_apply(const kn_chat_tmpl *tmpl, const kn_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, char *buf, size_t cap, size_t *needed);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop
#endif
