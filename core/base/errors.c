/* errors.c: the names and texts of lecho's error codes (the list is in
 * errors.h, LEI_ERRDEF). */
#include "errors.h"

static const struct {
    const char *name, *text;
} errs[] = {
    {"ok", "no error"},
#define LEI_ERRTAB(code, name, text) {name, text},
    LEI_ERRDEF(LEI_ERRTAB)
#undef LEI_ERRTAB
};

static int err_index(int code) {
    if (code < 0) code = -code;
    return code < LEI_E_MAX ? code : LEI_E_FAILED;
}

const char *lei_err_name(int code) { return errs[err_index(code)].name; }

const char *lei_err_text(int code) { return errs[err_index(code)].text; }
