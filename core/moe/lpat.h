/* lpat.h: Lua's string patterns (find, match, gmatch, gsub) in C, with the
 * results and error messages of LuaJIT 2.1's own functions, that a CPU
 * budget can stop: the matcher counts its steps and looks at a flag every
 * few thousand of them (and at least once per call on inputs over 64 KiB).
 * Plain finds are linear (memmem).  Used by modulator states (moe.c); knows
 * Lua, nothing of the context.
 */
#ifndef LECHO_LPAT_H
#define LECHO_LPAT_H

#include <lua.h>
#include <signal.h>

/* Replaces find, match, gmatch and gsub in the table on top of the stack
 * (left there) by this matcher's.  While *stop is non-zero they raise
 * "CPU budget exceeded".  stop may be NULL (never stops); when not, it must
 * outlive every function made here (the moe that owns the state). */
void lei_lpat_open(lua_State *L, volatile sig_atomic_t *stop);

/* core.lpat(): a new table holding the four functions, never stopped (for
 * the specs and the bench). */
int lei_lpat_new(lua_State *L);

#endif
