/* errors.c: the names and texts of lecho's error codes (the list is in
 * errors.h, LEI_ERRDEF). */
#include "errors.h"

#include <string.h>

static const struct {
    const char *name, *text;
} errs[] = {
    {"ok", "no error"},
#define LEI_ERRTAB(code, name, text, pub) {name, text},
    LEI_ERRDEF(LEI_ERRTAB)
#undef LEI_ERRTAB
};

static int err_index(int code) {
    if (code < 0) code = -code;
    return code < LEI_E_MAX ? code : LEI_E_FAILED;
}

const char *lei_err_name(int code) { return errs[err_index(code)].name; }

const char *lei_err_text(int code) { return errs[err_index(code)].text; }

int lei_err_code(const char *name, size_t len) {
    for (int i = 1; i < LEI_E_MAX; i++)
        if (strlen(errs[i].name) == len && memcmp(errs[i].name, name, len) == 0) return i;
    return 0;
}
