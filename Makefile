# lecho: one Makefile.  `make help` lists the targets.
# Variables LuaRocks overrides: CFLAGS, LIBFLAG, LUA_INCDIR, LUA_LIBDIR,
# INST_LIBDIR, INST_LUADIR, INST_BINDIR.

CC         ?= gcc
CFLAGS     ?= -O2 -g
WARN       := -Wall -Wextra -Werror -std=gnu99
LUA_INCDIR ?= /usr/include/luajit-2.1
LIBFLAG    ?= -shared
LUAJIT     ?= luajit
BUSTED     ?= /usr/bin/busted
SAN        ?=
ALLCFLAGS  := $(CFLAGS) $(WARN) -fPIC -fvisibility=hidden -I$(LUA_INCDIR) -Icore $(SAN)

CORE_SRC   := core/codec.c core/frame.c core/ctx.c
LUA_SRC    := core/codec_lua.c core/moe.c core/lua_lecho.c
HDRS       := $(wildcard core/*.h)
SO         := lua/lecho/core.so
CTESTS     := build/test_codec build/test_frame build/test_addr

# Debian packages the project needs, by the file that proves each is there.
DEPS := /usr/bin/luajit:luajit \
        /usr/include/luajit-2.1/lua.h:libluajit-5.1-dev \
        /usr/include/ev.h:libev-dev \
        /usr/lib/x86_64-linux-gnu/lua/5.1/cjson.so:lua-cjson \
        /usr/bin/busted:lua-busted \
        /usr/share/lua/5.1/socket.lua:lua-socket \
        /usr/sbin/ip:iproute2 \
        /usr/bin/luarocks:luarocks \
        /usr/bin/gcc:gcc \
        /usr/bin/make:make \
        /usr/bin/pkg-config:pkg-config \
        /usr/include/zmq.h:libzmq3-dev \
        /usr/bin/gnuplot:gnuplot-nox \
        /usr/bin/tmux:tmux

.PHONY: all deps test ctest spec asan demo bench clean help install

all: $(SO)

help:
	@echo "make          build the core module ($(SO))"
	@echo "make deps     install the Debian packages that are missing (apt-get)"
	@echo "make test     deps, build, C unit tests, then the busted specs under LuaJIT"
	@echo "make asan     the same suite with the core built under ASan and UBSan"
	@echo "make demo     atmosphere: a simulation and three viewers (full, region, diff), bytes per viewer"
	@echo "make bench    benchmark suite vs raw TCP and ZeroMQ (QUICK=1: < 30 s), bench/results/"
	@echo "make stress   seeded stress scenarios with real processes for STRESS_SECONDS (600); stress-seed SEED=N replays one"
	@echo "make clean    remove build products"

deps:
	@missing=""; for d in $(DEPS); do f=$${d%%:*}; p=$${d##*:}; \
	  [ -e $$f ] || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "make deps: need root to apt-get install$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build:
	@mkdir -p build

$(SO): $(CORE_SRC) $(LUA_SRC) $(HDRS)
	$(CC) $(ALLCFLAGS) $(LIBFLAG) -o $@ $(CORE_SRC) $(LUA_SRC) -lev $(LDFLAGS)

build/test_codec: core/test_codec.c core/codec.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test_codec.c core/codec.c $(LDFLAGS)

build/test_frame: core/test_frame.c core/frame.c core/codec.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test_frame.c core/frame.c core/codec.c $(LDFLAGS)

build/test_addr: core/test_addr.c core/addr.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test_addr.c core/addr.c $(LDFLAGS)

ctest: $(CTESTS)
	@for t in $(CTESTS); do ./$$t || exit 1; done

# busted runs under LuaJIT with the tree's own module paths first.
SPEC_ENV := LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" \
            LUA_CPATH="$(CURDIR)/lua/?.so;;" LECHO_ROOT="$(CURDIR)"
spec: $(SO)
	$(SPEC_ENV) $(SPEC_PRE) $(LUAJIT) $(BUSTED) $(BUSTED_ARGS) spec

test: deps
	$(MAKE) all ctest
	$(MAKE) spec

ASAN_LIBS := $(shell $(CC) -print-file-name=libasan.so) $(shell $(CC) -print-file-name=libubsan.so)
asan: deps
	$(MAKE) clean
	$(MAKE) all ctest SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined"
	$(MAKE) spec SPEC_PRE='LD_PRELOAD="$(ASAN_LIBS)" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1'
	$(MAKE) clean

# The atmosphere example: a simulation and three viewer processes (full,
# region, differencing), bytes per viewer; DEMO_SECONDS (10), LECHO_NAMESERVER
# (default: the simulation runs the name server).
demo: deps all
	$(SPEC_ENV) $(LUAJIT) examples/atmosphere/run.lua

# The benchmark suite (bench/run.lua): lecho from Lua and from the C API
# against raw TCP and ZeroMQ, in one run.  QUICK=1: small counts, < 30 s.
# Results: bench/results/ (results.json, table.md, *.png).
BENCH_BIN := bench/baseline_tcp bench/baseline_zmq bench/lecho_c
bench: deps all $(BENCH_BIN)
	$(SPEC_ENV) QUICK="$(QUICK)" $(LUAJIT) bench/run.lua

bench/baseline_tcp: bench/baseline_tcp.c bench/harness.h
	$(CC) $(CFLAGS) $(WARN) -o $@ $<

bench/baseline_zmq: bench/baseline_zmq.c bench/harness.h
	$(CC) $(CFLAGS) $(WARN) -o $@ $< -lzmq

bench/lecho_c: bench/lecho_c.c bench/harness.h $(CORE_SRC) $(HDRS)
	$(CC) $(CFLAGS) $(WARN) -Icore -o $@ bench/lecho_c.c $(CORE_SRC) -lev

# Used by luarocks make: copies the module, the Lua files and the scripts.
INST_LIBDIR ?= /usr/local/lib/lua/5.1
INST_LUADIR ?= /usr/local/share/lua/5.1
INST_BINDIR ?= /usr/local/bin
install: $(SO)
	mkdir -p $(INST_LIBDIR)/lecho $(INST_LUADIR)/lecho $(INST_BINDIR)
	cp $(SO) $(INST_LIBDIR)/lecho/core.so
	cp lua/lecho/*.lua $(INST_LUADIR)/lecho/
	cp scripts/lecho-* $(INST_BINDIR)/

clean:
	rm -rf build $(SO) lua/lecho/codec.so $(BENCH_BIN)

# The stress harness (stress/run.lua, issue 8): random seeds for
# STRESS_SECONDS (600) in scenarios of STRESS_SCENARIO_SECONDS (30) each;
# prints the scenarios run and every violation with its seed.
# `make stress-seed SEED=N [SECONDS=S] [SCENARIO=NAME]` replays one and keeps its logs.
STRESS_SECONDS ?= 600
STRESS_SCENARIO_SECONDS ?= 30
.PHONY: stress stress-seed
stress: all
	$(SPEC_ENV) $(SPEC_PRE) $(LUAJIT) stress/run.lua --for $(STRESS_SECONDS) --seconds $(STRESS_SCENARIO_SECONDS)

stress-seed: all
	$(SPEC_ENV) $(SPEC_PRE) $(LUAJIT) stress/run.lua --seed $(SEED) --seconds $(or $(SECONDS),30) \
	  $(if $(SCENARIO),--scenario $(SCENARIO)) --keep
