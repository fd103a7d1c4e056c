/* version.c: kn_version() (kiln_base.h). */
#include "kiln_base.h"

const char *kn_version(void) { return KN_VERSION; }
