/* jinja_json.h: JSON values into the chat-template interpreter (jinja_json.c). */
#ifndef KN_JINJA_JSON_H
#define KN_JINJA_JSON_H
#include "llm/jinja_impl.h"
#include "formats/hfconfig.h"   /* defines: kn_json */

kn_status jinja_from_json(jarena *a, const kn_json *j, int64_t v, jv *out, int depth);
#endif
