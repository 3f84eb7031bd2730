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
PKG_CONFIG ?= pkg-config
# libsodium (Debian libsodium-dev): the only crypto (identities, handshake, records).
SODIUM_CFLAGS := $(shell $(PKG_CONFIG) --cflags libsodium 2>/dev/null)
SODIUM_LIBS   := $(or $(shell $(PKG_CONFIG) --libs libsodium 2>/dev/null),-lsodium)
# OpenSSL's libcrypto (Debian libssl-dev), when found: the record ciphers'
# bulk work (core/transport/secure.c: AES-256-GCM and ChaCha20-Poly1305, 2.5x and 3.7x
# libsodium 1.0.18's here); the same wire bytes without it (libsodium).
# LECHO_OPENSSL=0 builds without it.
LECHO_OPENSSL ?= $(if $(shell $(PKG_CONFIG) --exists libcrypto 2>/dev/null && echo y),1,0)
ifeq ($(LECHO_OPENSSL),1)
SODIUM_CFLAGS += -DLECHO_OPENSSL $(shell $(PKG_CONFIG) --cflags libcrypto 2>/dev/null)
SODIUM_LIBS   += $(or $(shell $(PKG_CONFIG) --libs libcrypto 2>/dev/null),-lcrypto)
endif
# The MOE's compression operators (core/base/array_zip.c): zstd (libzstd-dev) and
# ZFP (libzfp-dev, which ships no pkg-config file: -lzfp).
ZIP_CFLAGS := $(shell $(PKG_CONFIG) --cflags libzstd 2>/dev/null)
# core.so is marked nodelete: libzfp pulls in libgomp, whose start-up
# allocation (8 bytes) LeakSanitizer reports as a leak once lua_close has
# unloaded them (make asan's ctest: 4 contexts, 32 bytes, "unknown module").
ZIP_LIBS   := $(or $(shell $(PKG_CONFIG) --libs libzstd 2>/dev/null),-lzstd) -lzfp -Wl,-z,nodelete
# libdeflate (libdeflate-dev): the recorder's CRC-32 (core/binding/lua_rsink.c),
# PCLMUL-folded; lua/lecho/recording.lua checks the same CRC with zlib's
# crc32 through the FFI (zlib1g-dev: libz.so).
ZIP_LIBS   += $(or $(shell $(PKG_CONFIG) --libs libdeflate 2>/dev/null),-ldeflate)

# core/ in folders by layer (doc/architecture.md "Layers"; each folder's
# README.md says what its files may include, spec/layers_spec.lua checks
# every #include against them): base, transport, moe,
# binding, capi, and test/, fuzz/ outside them; core/lecho.h, the public
# header, at the top.  Every layer's folder is on the include path, so an
# #include names a header by its file name alone (header names are unique).
CORE_LAYERS := base transport moe binding capi test
CORE_INC   := -Icore $(addprefix -Icore/,$(CORE_LAYERS))
ALLCFLAGS  := $(CFLAGS) $(WARN) -fPIC -fvisibility=hidden -I$(LUA_INCDIR) $(CORE_INC) $(SODIUM_CFLAGS) $(ZIP_CFLAGS) $(SAN)

CORE_SRC   := core/base/codec.c core/base/array.c core/base/errors.c core/transport/frame.c core/transport/addr.c \
              core/transport/ctx.c core/transport/conn.c core/transport/conn_io.c core/transport/rbuf.c \
              core/transport/accept.c \
              core/transport/inmap.c core/transport/peer.c core/transport/peers.c core/transport/chan.c \
              core/transport/local.c core/transport/sync.c core/transport/live.c core/transport/auth.c \
              core/transport/secure.c core/transport/plain.c core/transport/handshake.c core/transport/item.c \
              core/transport/log.c
LUA_SRC    := core/base/codec_lua.c core/base/array_lua.c core/base/array_zip.c core/moe/moe.c core/moe/moe_env.c \
              core/moe/moe_group.c core/moe/moe_svc.c core/moe/lpat.c core/binding/lua_ctx.c core/binding/lua_hook.c \
              core/binding/lua_chan.c core/binding/lua_prod.c core/binding/lua_sink.c core/binding/lua_moe.c core/binding/lua_loop.c core/binding/lua_auth.c \
              core/binding/lua_raw.c core/binding/lua_rsink.c core/binding/lua_rec.c
HDRS       := $(wildcard core/*.h core/*/*.h)
SO         := lua/lecho/core.so
WS_SO      := lua/lecho/ws.so
CTESTS     := build/test_codec build/test_frame build/test_inmap build/test_ctx build/test_addr build/test_errors \
              build/test_auth build/test_lpat build/test_shared build/test_args

# Debian packages the project needs, by the file that proves each is there:
# RUN_DEPS to build lecho and run it (make, make demo, the scripts), the
# rest for the test and bench suites (make deps, make test, make bench).
RUN_DEPS := /usr/bin/luajit:luajit \
        /usr/include/luajit-2.1/lua.h:libluajit-5.1-dev \
        /usr/include/ev.h:libev-dev \
        /usr/include/sodium.h:libsodium-dev \
        /usr/include/openssl/evp.h:libssl-dev \
        /usr/include/zstd.h:libzstd-dev \
        /usr/include/zfp.h:libzfp-dev \
        /usr/include/zlib.h:zlib1g-dev \
        /usr/include/libdeflate.h:libdeflate-dev \
        /usr/lib/x86_64-linux-gnu/lua/5.1/cjson.so:lua-cjson \
        /usr/bin/gcc:gcc \
        /usr/bin/make:make \
        /usr/include/wslay/wslay.h:libwslay-dev \
        /usr/include/nettle/sha1.h:nettle-dev
DEPS := $(RUN_DEPS) \
        /usr/bin/busted:lua-busted \
        /usr/bin/valgrind:valgrind \
        /usr/share/lua/5.1/socket.lua:lua-socket \
        /usr/sbin/ip:iproute2 \
        /usr/bin/luarocks:luarocks \
        /usr/bin/git:git \
        /usr/bin/pkg-config:pkg-config \
        /usr/include/zmq.h:libzmq3-dev \
        /usr/bin/gnuplot:gnuplot-nox \
        /usr/bin/tmux:tmux \
        /usr/bin/chromium:chromium \
        /usr/lib/python3/dist-packages/cffi/__init__.py:python3-cffi \
        /usr/lib/python3/dist-packages/pytest/__init__.py:python3-pytest \
        /usr/lib/python3/dist-packages/numpy/__init__.py:python3-numpy \
        /usr/lib/python3/dist-packages/ipykernel/__init__.py:python3-ipykernel \
        /usr/lib/python3/dist-packages/jupyter_client/__init__.py:python3-jupyter-client

# make bench's own packages (make bench-deps; not make deps, not make demo):
# the peers it runs beside lecho: NATS (plain and with TLS, its throwaway
# certificate made with the openssl command at bench time) and Redis, and
# OpenSSL's headers for bench/baseline_peers' TLS client.
BENCH_DEPS := /usr/sbin/nats-server:nats-server \
        /usr/bin/redis-server:redis-server \
        /usr/include/openssl/ssl.h:libssl-dev \
        /usr/bin/openssl:openssl

.PHONY: layer-objs all deps run-deps env bench-deps test ctest spec pytest asan demo keiretsu bench clean help install liblecho examples-c
.PHONY: install-python

# make (all): the core module, the gateway's WebSocket module and liblecho
# (the C API, which the Python package loads): the README's first `make`
# gives Python what it needs.  make rock builds only its two modules
# (LIBLECHO_ALL=: the rock's C API is make install's).
LIBLECHO_ALL := build/liblecho.so
all: $(SO) $(WS_SO) $(LIBLECHO_ALL)

help:
	@echo "Targets:"
	@echo "  make             build the core module ($(SO)), the gateway's $(WS_SO) and liblecho (build/liblecho.so)"
	@echo "  make deps        check the Debian packages lecho and its test and bench suites need, apt-get install the missing ones"
	@echo "  make run-deps    the same for only those needed to build and run lecho (make demo checks these)"
	@echo "  make env         print the exports that let luajit find this checkout's lecho: eval \"\$$(make -s env)\""
	@echo "  make test        deps, build, C unit tests, the busted specs under LuaJIT, then make pytest"
	@echo "  make fuzz        every libFuzzer harness (core/fuzz/fuzz_*.c: $(FUZZ_HARNESSES)) for FUZZ_SECONDS each, clang installed if missing"
	@echo "  make fuzz-quick  the same for FUZZ_QUICK_SECONDS each (make test runs it); fails on a crash"
	@echo "  make fuzz-build  only build the harnesses (build/fuzz_<name>)"
	@echo "  make ctest       the C unit tests only: codec, framing, two contexts through lecho.h, error names, identities, the pattern matcher's step limit"
	@echo "  make pytest      the Python package's tests (python/tests, spec/python) with Debian's pytest, against real processes"
	@echo "  make spec        the busted specs only, SPEC_JOBS files at a time (BUSTED_ARGS: e.g. spec/codec_spec.lua: that one)"
	@echo "  make asan        the same suite with the core built under ASan and UBSan, leaks checked; ends with PASS or FAIL"
	@echo "  make demo        atmosphere: a simulation (a <f8 array field) and five viewers (full, region, diff, zfp, quant), bytes, error and CPU per step"
	@echo "  make keiretsu    instant messaging over four nodes (network namespaces if allowed): messages/s for 1-4 nodes, three killed, acknowledged messages counted"
	@echo "  make bench       benchmark suite vs raw TCP, ZeroMQ, NATS and Redis, results in bench/results/"
	@echo "  make bench-gateway  WebSocket fan-out to 100 clients: lecho-gateway beside nats-server (QUICK=1: small)"
	@echo "  make bench-deps  check (apt-get install) make bench's own packages: $(foreach d,$(BENCH_DEPS),$(lastword $(subst :, ,$(d))))"
	@echo "  make stress      seeded stress scenarios with real processes for STRESS_SECONDS"
	@echo "  make stress-seed replay one stress scenario: SEED=N [SECONDS=S] [SCENARIO=NAME], keeps its logs"
	@echo "  make install     the Lua tree, the core, the scripts, the C API (lecho.h, liblecho, lecho.pc) and the Python package under PREFIX"
	@echo "  make install-capi  only the C API part of make install"
	@echo "  make install-python  only the Python package (python/lecho) part of make install, into INST_PYDIR"
	@echo "  make liblecho    build/liblecho.so, the C API (core/lecho.h) for this checkout"
	@echo "  make layer-objs  every .c of the five layers as an object in OBJ_DIR (spec/layers_spec.lua reads their calls with nm)"
	@echo "  make examples-c  install into EXAMPLE_PREFIX (build/stage), build examples/c/heat there with pkg-config"
	@echo "  make rock        the core for luarocks make (build/rock/core.so, built afresh)"
	@echo "  make rock-pack   lecho-0.1.0-1.src.rock from this checkout's HEAD, offline (in ROCK_OUT)"
	@echo "  make clean       remove build products"
	@echo "  make help        this text"
	@echo "Variables (make VAR=value ...):"
	@echo "  QUICK=1                  make bench: small counts, 3 repetitions, < 60 s"
	@echo "  BENCH_ONLY=a,b           make bench: only these workloads (luajit bench/run.lua --help)"
	@echo "  FUZZ_SECONDS=$(FUZZ_SECONDS)          make fuzz: how long per harness (corpus and crashes in build/fuzz/<name>/)"
	@echo "  FUZZ_QUICK_SECONDS=$(FUZZ_QUICK_SECONDS)     make fuzz-quick: how long per harness"
	@echo "  STRESS_SECONDS=$(STRESS_SECONDS)       make stress: total time"
	@echo "  STRESS_SCENARIO_SECONDS=$(STRESS_SCENARIO_SECONDS) make stress: time per scenario"
	@echo "  SEED, SECONDS, SCENARIO, MODE  make stress-seed: which scenario to replay, for how long, keyed or protected"
	@echo "  DEMO_SECONDS, LECHO_NAMESERVER  make demo: how long (10), which name server"
	@echo "  KEIRETSU_ARGS            make keiretsu: options of examples/keiretsu/run.lua (--help)"
	@echo "  BUSTED_ARGS              make spec/test: arguments for busted (files, --filter ...)"
	@echo "  SPEC_JOBS=$(SPEC_JOBS)              make spec/test/asan: spec files run at a time (1: one busted for spec/)"
	@echo "  BUILD_JOBS=$(BUILD_JOBS)             make test, fuzz-build: parallel compile jobs"
	@echo "  ROCK_OUT=.               make rock-pack: where the source rock is written"
	@echo "  OBJ_DIR=$(OBJ_DIR)         where the core's objects are compiled (make rock: its own)"
	@echo "  CC=$(CC) CFLAGS='$(CFLAGS)' LDFLAGS LIBFLAG='$(LIBFLAG)'  the compiler and its flags"
	@echo "  LUA_INCDIR=$(LUA_INCDIR)  LuaJIT's headers"
	@echo "  LUAJIT=$(LUAJIT) BUSTED=$(BUSTED)  the interpreter and the test runner"
	@echo "  PYTHON=$(PYTHON)  make pytest, install-python: Debian's python3 (cffi, pytest, numpy from Debian)"
	@echo "  PYTEST_ARGS              make pytest: arguments for pytest (-k NAME, a file ...)"
	@echo "  INST_PYDIR=$(INST_PYDIR)  make install: where the Python package goes"
	@echo "  SAN                      extra compiler flags for sanitizers (make asan sets them)"
	@echo "  ASAN_LEAKS=$(ASAN_LEAKS) ASAN_LOG    make asan: LeakSanitizer on (0: off); where its reports go"
	@echo "  ASAN_SLOW=$(ASAN_SLOW)            make asan: how much slower processes run (specs widen their margins for a process's own work)"
	@echo "  PREFIX=$(PREFIX) DESTDIR  make install: where to (DESTDIR: a staging root)"
	@echo "  INST_LIBDIR, INST_LUADIR, INST_BINDIR  make install: the Lua tree, the core, the scripts (under PREFIX)"
	@echo "  INST_INCDIR, INST_CLIBDIR, INST_PCDIR   make install: the C API (LuaRocks: only when INST_INCDIR is given)"
	@echo "  CAPI_IN_TREE             make install under LuaRocks (the rockspecs set it): the C API in the tree's include/, lib/, lib/pkgconfig/"
	@echo "  EXAMPLE_PREFIX           make examples-c: the install it builds against"
	@echo "  APT=$(APT)             make deps: the package tool"
	@echo "  PKG_CONFIG=$(PKG_CONFIG)  finds libsodium's flags (SODIUM_CFLAGS, SODIUM_LIBS)"
	@echo "  LECHO_OPENSSL=$(LECHO_OPENSSL)          1: keyed records' ciphers by OpenSSL's libcrypto (default when pkg-config finds it), 0: by libsodium"

# Prints what it checks, what is missing and what it installs, or "all present".
APT ?= apt-get
# the target that runs the check, so its lines say what the user ran
# (run-deps and bench-deps set it on their command line)
DEPS_LABEL = make deps
deps:
	@echo "$(DEPS_LABEL): checking $(words $(DEPS)) Debian packages: $(foreach d,$(DEPS),$(lastword $(subst :, ,$(d))))"; \
	missing=""; for d in $(DEPS); do f=$${d%%:*}; p=$${d##*:}; \
	  if [ ! -e $$f ]; then echo "$(DEPS_LABEL): $$p missing (no $$f)"; missing="$$missing $$p"; fi; done; \
	if [ -z "$$missing" ]; then echo "$(DEPS_LABEL): all present"; exit 0; fi; \
	if [ "$$(id -u)" != 0 ]; then echo "$(DEPS_LABEL): need root to apt-get install$$missing" >&2; exit 1; fi; \
	echo "$(DEPS_LABEL): installing$$missing ($(APT) update, $(APT) install)"; \
	$(APT) update -qq && DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq $$missing && \
	echo "$(DEPS_LABEL): installed$$missing"

# The same check for make bench's own list (BENCH_DEPS).
bench-deps:
	@$(MAKE) --no-print-directory deps DEPS="$(BENCH_DEPS)" DEPS_LABEL="make bench-deps"

build:
	@mkdir -p build

# The core's objects, one compile per source (in parallel under -j: make
# test), in OBJ_DIR (make rock: its own, built afresh).
OBJ_DIR  ?= build/obj
CORE_OBJ := $(patsubst core/%.c,$(OBJ_DIR)/%.o,$(CORE_SRC) $(LUA_SRC))
# Each compile writes what the object includes (-MMD -MP: OBJ_DIR/x.d, read
# below): a header change rebuilds the objects that include it, no others.
# An object without its .d (built before, or the .d removed) is rebuilt once
# (the empty rule "makes" the missing .d); touch: the object ends newer than
# its .d.
DEPFLAGS  = -MMD -MP
$(OBJ_DIR)/%.o: core/%.c $(OBJ_DIR)/%.d
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(DEPFLAGS) -c -o $@ $<
	@touch $@
# Every .c of the ranked layers (liblecho's and ws.so's too) as an object:
# spec/layers_spec.lua builds them (make layer-objs) and reads the calls
# between files and layers from their symbols (nm).
LAYER_SRC := $(wildcard $(patsubst %,core/%/*.c,base transport moe binding capi))
LAYER_OBJ := $(patsubst core/%.c,$(OBJ_DIR)/%.o,$(LAYER_SRC))
layer-objs: $(LAYER_OBJ)
$(sort $(CORE_OBJ:.o=.d) $(LAYER_OBJ:.o=.d)):
include $(wildcard $(sort $(CORE_OBJ:.o=.d) $(LAYER_OBJ:.o=.d)))

$(SO): $(CORE_OBJ)
	$(CC) $(ALLCFLAGS) $(LIBFLAG) -o $@ $(CORE_OBJ) -lev $(SODIUM_LIBS) $(ZIP_LIBS) -lpthread $(LDFLAGS)

# lecho.ws (lua/lecho/ws.so): the gateway's WebSocket connections, wslay's
# framing and nettle's SHA-1; a module of its own, so that the core does not
# link them.
$(WS_SO): core/binding/lua_ws.c
	$(CC) $(ALLCFLAGS) $(LIBFLAG) -o $@ core/binding/lua_ws.c -lwslay -lnettle $(LDFLAGS)

build/test_codec: core/test/test_codec.c core/base/codec.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_codec.c core/base/codec.c $(LDFLAGS)

build/test_frame: core/test/test_frame.c core/transport/frame.c core/base/codec.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_frame.c core/transport/frame.c core/base/codec.c $(LDFLAGS)

build/test_inmap: core/test/test_inmap.c core/transport/inmap.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_inmap.c core/transport/inmap.c $(LDFLAGS)

build/test_addr: core/test/test_addr.c core/transport/addr.c $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_addr.c core/transport/addr.c $(LDFLAGS)

# Identities, trust, pins and (later) the keyed handshake, on the context API (ctx.h) alone.
build/test_auth: core/test/test_auth.c $(CORE_SRC) $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_auth.c $(CORE_SRC) -lev $(SODIUM_LIBS) $(LDFLAGS)

# One batch for many destinations (peer.c's shared batches): nine contexts of the core in one process.
build/test_shared: core/test/test_shared.c $(CORE_SRC) $(HDRS) | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_shared.c $(CORE_SRC) -lev $(SODIUM_LIBS) $(LDFLAGS)

# The pattern matcher's step limit: a stop flag set by another thread ends a stuck call.
build/test_lpat: core/test/test_lpat.c core/moe/lpat.c core/moe/lpat.h core/test/test.h | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_lpat.c core/moe/lpat.c -lluajit-5.1 -lpthread $(LDFLAGS)

ctest: $(CTESTS) $(SO)
	@for t in $(CTESTS); do ./$$t || exit 1; done

# The fuzzers (libFuzzer, clang -fsanitize=fuzzer,address,undefined), one
# per harness core/fuzz/fuzz_<name>.c: frame (the frame parser and the HELLO,
# BIND, EVENT, ACK parsers, round trips), codec (the C walker and the Lua
# decoder agree; decode/encode round trips), conn (a protected peer's frames
# into a context whose hooks close, submit, re-target, suspend from inside),
# ns (the name server's and a manager's registry in LuaJIT, in-process, fed
# decoded control messages),
# zip (the compressed-array decoder, array_zip.c: hostile zstd and ZFP
# streams), handshake (arbitrary bytes as
# the remote side of an accepted and a dialled keyed connection, seeded with
# recorded real handshakes).  Seeds: core/fuzz/<name>/ (in git; the
# handshake one records its own into its corpus first).  `make fuzz` runs
# each for FUZZ_SECONDS, corpus copies and crashes in build/fuzz/<name>/;
# `make fuzz-quick` runs each for FUZZ_QUICK_SECONDS and fails on a crash
# (make test runs it).  clang and its fuzzer runtime come through `make deps`.
FUZZ_SECONDS ?= 60
FUZZ_QUICK_SECONDS ?= 3
FUZZ_HARNESSES := frame codec conn ns handshake zip
FUZZ_CC      := clang
FUZZ_RT      := $(firstword $(wildcard /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a) \
                  /usr/lib/llvm-14/lib/clang/14/lib/linux/libclang_rt.fuzzer-x86_64.a)
FUZZ_DEPS    := /usr/bin/clang:clang $(FUZZ_RT):libclang-rt-14-dev /usr/include/sodium.h:libsodium-dev \
                /usr/include/ev.h:libev-dev
FUZZ_FLAGS   := -g -O1 $(WARN) $(CORE_INC) -I$(LUA_INCDIR) $(SODIUM_CFLAGS) -fsanitize=fuzzer,address,undefined \
                -fno-sanitize-recover=undefined
.PHONY: fuzz fuzz-quick fuzz-build
# Every core source is compiled once per run into build/fuzz-obj/ (conn and
# handshake share CORE_SRC, frame/codec/ns share the codec), and fuzz-build
# makes the objects and the five harnesses in parallel (-j, the machine's
# cores): built serially, whole, per harness, it took twice as long.
FUZZ_OBJ  := build/fuzz-obj
FUZZ_CORE := $(CORE_SRC:core/%.c=$(FUZZ_OBJ)/%.o)
BUILD_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
$(FUZZ_OBJ)/%.o: core/%.c $(FUZZ_OBJ)/%.d
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(DEPFLAGS) -c -o $@ $<
	@touch $@
FUZZ_DEPS_D := $(patsubst core/%.c,$(FUZZ_OBJ)/%.d,$(CORE_SRC) core/base/codec_lua.c core/base/array_zip.c)
$(FUZZ_DEPS_D):
include $(wildcard $(FUZZ_DEPS_D))

build/fuzz_handshake: core/fuzz/fuzz_handshake.c $(FUZZ_CORE) $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -DLECHO_FUZZ_DIR='"$(CURDIR)/build/fuzz/sock"' \
	  -o $@ core/fuzz/fuzz_handshake.c $(FUZZ_CORE) -lev $(SODIUM_LIBS)

build/fuzz_frame: core/fuzz/fuzz_frame.c $(FUZZ_OBJ)/transport/frame.o $(FUZZ_OBJ)/base/codec.o $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ core/fuzz/fuzz_frame.c $(FUZZ_OBJ)/transport/frame.o $(FUZZ_OBJ)/base/codec.o

build/fuzz_conn: core/fuzz/fuzz_conn.c $(FUZZ_CORE) $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -DLECHO_FUZZ_DIR='"$(CURDIR)/build/fuzz/sock"' \
	  -o $@ core/fuzz/fuzz_conn.c $(FUZZ_CORE) -lev $(SODIUM_LIBS)

# (codec_lua.c names its errors through errors.c's table: errors.o with it)
build/fuzz_ns: core/fuzz/fuzz_ns.c $(FUZZ_OBJ)/base/codec_lua.o $(FUZZ_OBJ)/base/codec.o $(FUZZ_OBJ)/base/array.o \
  $(FUZZ_OBJ)/base/errors.o $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -DLECHO_LUA_DIR='"$(CURDIR)/lua"' -o $@ core/fuzz/fuzz_ns.c $(FUZZ_OBJ)/base/codec_lua.o \
	  $(FUZZ_OBJ)/base/codec.o $(FUZZ_OBJ)/base/array.o $(FUZZ_OBJ)/base/errors.o -lluajit-5.1

build/fuzz_codec: core/fuzz/fuzz_codec.c $(FUZZ_OBJ)/base/codec_lua.o $(FUZZ_OBJ)/base/codec.o $(FUZZ_OBJ)/base/array.o \
  $(FUZZ_OBJ)/base/errors.o $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ core/fuzz/fuzz_codec.c $(FUZZ_OBJ)/base/codec_lua.o $(FUZZ_OBJ)/base/codec.o \
	  $(FUZZ_OBJ)/base/array.o $(FUZZ_OBJ)/base/errors.o -lluajit-5.1

# the compressed-array decoder (array_zip.c) against libzstd and libzfp
build/fuzz_zip: core/fuzz/fuzz_zip.c $(FUZZ_OBJ)/base/array_zip.o $(FUZZ_OBJ)/base/array.o $(FUZZ_OBJ)/base/codec.o $(HDRS) | build
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ core/fuzz/fuzz_zip.c $(FUZZ_OBJ)/base/array_zip.o $(FUZZ_OBJ)/base/array.o \
	  $(FUZZ_OBJ)/base/codec.o $(ZIP_LIBS)

fuzz-build:
	@$(MAKE) --no-print-directory deps DEPS="$(FUZZ_DEPS)"
	@$(MAKE) --no-print-directory -j$(BUILD_JOBS) $(foreach h,$(FUZZ_HARNESSES),build/fuzz_$(h))

# $(1): seconds per harness.  Each runs in build/fuzz/<name>/ on corpus/,
# which starts as a copy of core/fuzz/<name>/; a crash stops make.
FUZZ_RUN = mkdir -p build/fuzz/sock && for h in $(FUZZ_HARNESSES); do \
	  mkdir -p build/fuzz/$$h/corpus && { [ ! -d core/fuzz/$$h ] || cp -n core/fuzz/$$h/* build/fuzz/$$h/corpus/; } && \
	  echo "make fuzz: $$h for $(1) s" && \
	  ( cd build/fuzz/$$h && LECHO_FUZZ_SEEDS=corpus ../../fuzz_$$h -max_total_time=$(1) -max_len=8192 \
	    -timeout=20 -print_final_stats=1 -artifact_prefix=./ corpus 2>fuzz.log; rc=$$?; \
	    grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|Done)' fuzz.log; \
	    [ $$rc -eq 0 ] || { tail -40 fuzz.log; echo "make fuzz: $$h FAILED (input in build/fuzz/$$h/)"; exit 1; } ) || exit 1; \
	done

fuzz: fuzz-build
	@$(call FUZZ_RUN,$(FUZZ_SECONDS))

fuzz-quick: fuzz-build
	@$(call FUZZ_RUN,$(FUZZ_QUICK_SECONDS))

# liblecho: the public C API (core/lecho.h), a private LuaJIT state that
# loads the Lua layer.  build/liblecho.so finds the Lua files of this
# checkout; the installed one (build/inst/) those of INST_LUADIR/INST_LIBDIR.
LECHO_LIBS := -lluajit-5.1
LECHO_SRC  := core/capi/lecho.c core/capi/lecho_value.c core/capi/lecho_array.c core/capi/lecho_pending.c core/capi/lecho_recorder.c core/base/errors.c core/base/codec.c
build/liblecho.so: $(LECHO_SRC) core/lecho.h core/capi/lecho_int.h core/binding/lua_prod.h core/base/errors.h core/base/array.h core/base/codec.h | build
	$(CC) $(ALLCFLAGS) -shared -o $@ $(LECHO_SRC) \
	  -DLECHO_LUA_DIR='"$(CURDIR)/lua"' -DLECHO_LUA_CDIR='"$(CURDIR)/lua"' $(LECHO_LIBS) $(LDFLAGS)

liblecho: build/liblecho.so $(SO)

build/test_ctx: core/test/test_ctx.c core/lecho.h core/test/test.h build/liblecho.so | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_ctx.c -Lbuild -llecho -Wl,-rpath,$(CURDIR)/build -lpthread $(LDFLAGS)

# Every function of lecho.h with NULL in each pointer argument, NaN as each timeout: one forked child a case.
build/test_args: core/test/test_args.c core/lecho.h core/test/test.h build/liblecho.so | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_args.c -Lbuild -llecho -Wl,-rpath,$(CURDIR)/build -lm $(LDFLAGS)

# errors.c is compiled in as well: lei_err_name is hidden in liblecho.
build/test_errors: core/test/test_errors.c core/base/errors.c core/base/errors.h core/lecho.h core/test/test.h build/liblecho.so | build
	$(CC) $(ALLCFLAGS) -o $@ core/test/test_errors.c core/base/errors.c -Lbuild -llecho -Wl,-rpath,$(CURDIR)/build $(LDFLAGS)

# busted runs under LuaJIT with the tree's own module paths first.
SPEC_ENV := LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;" \
            LUA_CPATH="$(CURDIR)/lua/?.so;;" LECHO_ROOT="$(CURDIR)"
# With no spec file named (make test, make asan): every spec file in its own
# busted, SPEC_JOBS at a time, the two that load the machine alone after
# (spec/support/shards.sh; one total line at the end).  Most of a spec's time
# is waiting, not CPU (timers, other processes): one after another the suite
# was 9 minutes of CI; `bash .ci/run` took 4 min 47 s with it (load 2-20).
# Six spec files, 5 interleaved runs (load 5.7-8.3): 3 at a time took 0.46x
# the time of one busted for them (0.40-0.46).  SPEC_JOBS=1: one busted for
# the whole spec/ directory.
SPEC_JOBS ?= 3
SPEC_SHARDS = $(if $(filter %.lua,$(BUSTED_ARGS)),,$(filter-out 1,$(SPEC_JOBS)))
spec: $(SO) $(WS_SO)
	$(SPEC_ENV) $(if $(SPEC_SHARDS),bash spec/support/shards.sh $(SPEC_JOBS) env) $(SPEC_PRE) $(LUAJIT) $(BUSTED) $(BUSTED_ARGS) $(if $(SPEC_SHARDS)$(filter %.lua,$(BUSTED_ARGS)),,spec)

# The Python package (python/lecho, over build/liblecho.so) against real
# processes, and the protocol peer written from doc/protocol.md in Python's
# standard library (spec/python).  pytest prints "N passed" (.ci/run counts it).
PYTHON      ?= /usr/bin/python3
PYTEST_ARGS ?=
pytest: $(SO) build/liblecho.so
	$(SPEC_ENV) PYTHONPATH="$(CURDIR)/python" $(PYTHON) -m pytest -q -p no:cacheprovider \
	  $(or $(PYTEST_ARGS),python/tests spec/python)

# The core, liblecho and the C tests build in parallel (-j, the machine's
# cores; output kept per target): 22.7 s -> 17.0 s from clean here.
test: deps
	$(MAKE) -j$(BUILD_JOBS) -Otarget all ctest
	$(MAKE) spec
	$(MAKE) pytest
	$(MAKE) fuzz-quick

# make asan: the core, liblecho and the C tests built with ASan and UBSan, the
# C tests and every spec run with both, LeakSanitizer on in every process
# (the specs' luajit processes get the runtimes by LD_PRELOAD, and so does
# every program they start).  Each report goes to a file of its own in
# ASAN_LOG (named for its program and pid), none to the specs' stderr; a
# memory error aborts its process (abort_on_error), a leak does not change its
# exit status (exitcode=0: a spec checks behaviour, the report is judged
# after).  spec/support/lsan.supp: the leaks at exit that are not leaks (each
# with its why); spec/support/asan_report.sh: the verdict, the last line
# ("make asan: PASS" or "make asan: FAIL"): a report is lecho's, and fails
# the run, when its process is lecho's code (luajit; a C program of bench/,
# spec/support/, core/test/, core/fuzz/, examples/c/) or a frame of it is
# (core/, bench/, spec/support/, lecho/*.so, liblecho.so); the leaks of any
# other program the specs start (cc1, as, mktemp, sed, git, zip, python3's
# peer, ...) are counted by program, not failed; a memory error or a UBSan
# report fails whatever the program (spec/asan_report_spec.lua).  The price of the leak check: a process
# that ends by os.exit(code) (lua_close skipped) has a suppressed leak, and
# matching it runs the symbolizer at its exit: ~0.3 s of CPU and a 42 MiB
# llvm-symbolizer child; under a heavy load specs that wait a few seconds
# for a child's exit may fail.  ASAN_LEAKS=0: no leak check (the run before).
# ASAN_SLOW: how much slower the processes run (spec/support.lua's S.SLOW,
# the factor on the margins specs give a process's own work).
ASAN_SLOW ?= 4
ASAN_LIBS := $(shell $(CC) -print-file-name=libasan.so) $(shell $(CC) -print-file-name=libubsan.so)
ASAN_LOG  ?= $(CURDIR)/asan-logs
ASAN_LEAKS ?= 1
ASAN_ENV   = ASAN_OPTIONS=detect_leaks=$(ASAN_LEAKS):exitcode=0:abort_on_error=1:quarantine_size_mb=16:log_path=$(ASAN_LOG)/asan:log_exe_name=1 \
             LSAN_OPTIONS=suppressions=$(CURDIR)/spec/support/lsan.supp:print_suppressions=0 \
             UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:log_path=$(ASAN_LOG)/ubsan:log_exe_name=1
asan: deps
	$(MAKE) clean
	rm -rf $(ASAN_LOG) && mkdir -p $(ASAN_LOG)
	@st=0; \
	$(MAKE) all ctest SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" $(ASAN_ENV) || st=$$?; \
	[ $$st -ne 0 ] || $(MAKE) spec SPEC_PRE='LD_PRELOAD="$(ASAN_LIBS)" LECHO_SPEC_SLOW=$(ASAN_SLOW) $(ASAN_ENV)' || st=$$?; \
	$(MAKE) clean; \
	bash spec/support/asan_report.sh $(ASAN_LOG) $$st

# The atmosphere example: a simulation and five viewer processes (full,
# region, differencing, ZFP, quantized), bytes, error and CPU per step; DEMO_SECONDS (10), LECHO_NAMESERVER
# (default: the simulation runs the name server).
demo: run-deps all
	$(SPEC_ENV) $(LUAJIT) examples/atmosphere/run.lua

run-deps:
	@$(MAKE) --no-print-directory deps DEPS="$(RUN_DEPS)" DEPS_LABEL="make run-deps"

# For running one's own script from a checkout: eval "$(make -s env)", then
# luajit my.lua (after make).  The same paths the specs and demos use.
env:
	@echo 'export LUA_PATH="$(CURDIR)/lua/?.lua;$(CURDIR)/lua/?/init.lua;;"'
	@echo 'export LUA_CPATH="$(CURDIR)/lua/?.so;;"'

# The Keiretsu example: instant messaging over four nodes, each in its own
# network namespace when allowed (root), else loopback processes; messages/s
# for 1..4 nodes, then three nodes killed while blasting, every acknowledged
# message looked for.  KEIRETSU_ARGS: run.lua's options (--phase 5 ...).
keiretsu: deps all
	$(SPEC_ENV) $(LUAJIT) examples/keiretsu/run.lua $(KEIRETSU_ARGS)

# The benchmark suite (bench/run.lua): lecho from Lua and from the C API
# against raw TCP, ZeroMQ, NATS and Redis (the servers started by the bench
# on loopback ports it picks), in one run.  QUICK=1: small counts, < 30 s.
# Results: bench/results/ (results.json, table.md, *.png); bench/README.md.
BENCH_BIN := bench/baseline_tcp bench/baseline_zmq bench/baseline_peers bench/lecho_c bench/lecho_h bench/ws_fanout
bench: deps bench-deps all $(BENCH_BIN)
	$(SPEC_ENV) QUICK="$(QUICK)" $(LUAJIT) bench/run.lua

# The gateway row (bench/README.md "Gateway"): WebSocket fan-out of 1 KiB
# events to 100 clients, lecho-gateway beside nats-server's WebSocket
# listener; QUICK=1: 1000 events, one repetition.  bench/results/gateway.json.
.PHONY: bench-gateway
bench-gateway: deps bench-deps all bench/ws_fanout
	$(SPEC_ENV) QUICK="$(QUICK)" $(LUAJIT) bench/gateway_bench.lua

bench/ws_fanout: bench/ws_fanout.c
	$(CC) $(CFLAGS) $(WARN) -o $@ $<

bench/baseline_tcp: bench/baseline_tcp.c bench/harness.h
	$(CC) $(CFLAGS) $(WARN) -o $@ $<

bench/baseline_zmq: bench/baseline_zmq.c bench/harness.h
	$(CC) $(CFLAGS) $(WARN) -o $@ $< -lzmq

# NATS (text protocol, TLS through OpenSSL) and Redis (RESP) clients.
bench/baseline_peers: bench/baseline_peers.c bench/harness.h
	$(CC) $(CFLAGS) $(WARN) -o $@ $< -lssl -lcrypto

# The public C API (lecho.h) in the same workloads as lecho_c: the Lua layer included.
bench/lecho_h: bench/lecho_h.c bench/harness.h bench/lecho_bench.h core/lecho.h build/liblecho.so
	$(CC) $(CFLAGS) $(WARN) $(CORE_INC) -o $@ bench/lecho_h.c -Lbuild -llecho -Wl,-rpath,$(CURDIR)/build

bench/lecho_c: bench/lecho_c.c bench/harness.h bench/lecho_bench.h $(CORE_SRC) $(HDRS)
	$(CC) $(CFLAGS) $(WARN) $(CORE_INC) $(SODIUM_CFLAGS) -o $@ bench/lecho_c.c $(CORE_SRC) -lev $(SODIUM_LIBS)

# `make install [PREFIX=/usr/local] [DESTDIR=]`: the Lua module tree, the
# core, the scripts, and the C API (lecho.h, liblecho.so, lecho.pc).  The
# scripts get INST_LUADIR and INST_LIBDIR written in, so they find the Lua
# tree with no LUA_PATH/LUA_CPATH set.
# LuaRocks (`luarocks make`) passes INST_LIBDIR, INST_LUADIR, INST_BINDIR on
# the command line: then the C API is installed only if INST_INCDIR is given
# too (with INST_CLIBDIR; INST_PCDIR defaults to INST_CLIBDIR/pkgconfig).
PREFIX       ?= /usr/local
INST_LIBDIR  ?= $(PREFIX)/lib/lua/5.1
INST_LUADIR  ?= $(PREFIX)/share/lua/5.1
INST_BINDIR  ?= $(PREFIX)/bin
INST_INCDIR  ?= $(PREFIX)/include
INST_CLIBDIR ?= $(PREFIX)/lib
INST_PCDIR   ?= $(INST_CLIBDIR)/pkgconfig
LECHO_VERSION := 0.1.0
# CAPI_IN_TREE (the rockspecs): the C API goes into the LuaRocks tree the
# rock is installed in (ROCK_TREE below): TREE/include/lecho.h,
# TREE/lib/liblecho.so, TREE/lib/pkgconfig/lecho.pc, where a C user looks.
CAPI_IN_TREE ?=
CAPI_INSTALL = $(if $(filter command line,$(origin INST_LIBDIR)),$(or $(filter command line,$(origin INST_INCDIR)),$(CAPI_IN_TREE)),yes)
# The Python package too, unless the Lua tree's directories were given
# (LuaRocks) without PREFIX or INST_PYDIR: a rock's install stays in its tree.
PY_INSTALL   := $(if $(filter command line,$(origin INST_LIBDIR)),$(filter command line,$(origin PREFIX) $(origin INST_PYDIR)),yes)
# Files an earlier install left that would shadow a module moved since
# (require finds lecho/X.lua before lecho/X/init.lua): lecho.gateway went
# from lecho/gateway.lua to lecho/gateway/, its page to lecho/gateway/page.lua.
STALE_LUA := lecho/gateway.lua lecho/gateway_page.lua

install: $(SO) $(WS_SO)
	mkdir -p $(DESTDIR)$(INST_LIBDIR)/lecho $(DESTDIR)$(INST_LUADIR) $(DESTDIR)$(INST_BINDIR)
	rm -f $(addprefix $(DESTDIR)$(INST_LUADIR)/,$(STALE_LUA))
	cp $(SO) $(DESTDIR)$(INST_LIBDIR)/lecho/core.so
	cp $(WS_SO) $(DESTDIR)$(INST_LIBDIR)/lecho/ws.so
	cd lua && find lecho -name '*.lua' | while read -r f; do \
	  mkdir -p "$(DESTDIR)$(INST_LUADIR)/$$(dirname $$f)" && cp "$$f" "$(DESTDIR)$(INST_LUADIR)/$$f" || exit 1; done
	for f in scripts/lecho scripts/lecho-*; do \
	  sed -e 's|@LECHO_LUADIR@|$(INST_LUADIR)|; s|@LECHO_LIBDIR@|$(INST_LIBDIR)|' "$$f" > "$(DESTDIR)$(INST_BINDIR)/$${f#scripts/}" && \
	  chmod 755 "$(DESTDIR)$(INST_BINDIR)/$${f#scripts/}" || exit 1; done
	$(if $(CAPI_INSTALL),$(MAKE) install-capi)
	$(if $(and $(CAPI_INSTALL),$(PY_INSTALL)),$(MAKE) install-python)

# The installed liblecho is built for where the Lua files go (INST_LUADIR,
# INST_LIBDIR; LECHO_LUA_DIR and LECHO_LUA_CDIR override them at run time).
# lecho.pc's prefix: PREFIX when given, else the directory INST_INCDIR is in
# (LuaRocks gives INST_INCDIR, not PREFIX).
# Under LuaRocks INST_LUADIR and INST_LIBDIR are the rock's staging dirs
# (TREE/lib/luarocks/rocks-5.1/NAME/VERSION/lua, .../lib), gone once it is
# deployed: the library is then built for TREE/share/lua/5.1, TREE/lib/lua/5.1.
ROCK_TREE = $(if $(findstring /lib/luarocks/rocks-5.1/,$(INST_LUADIR)),$(firstword $(subst /lib/luarocks/rocks-5.1/, ,$(INST_LUADIR))))
RUN_LUADIR = $(if $(ROCK_TREE),$(ROCK_TREE)/share/lua/5.1,$(INST_LUADIR))
RUN_LIBDIR = $(if $(ROCK_TREE),$(ROCK_TREE)/lib/lua/5.1,$(INST_LIBDIR))
PC_PREFIX = $(if $(filter command line,$(origin PREFIX)),$(PREFIX),$(patsubst %/,%,$(dir $(INST_INCDIR))))
ifneq ($(CAPI_IN_TREE),)
ifeq ($(ROCK_TREE),)
$(error CAPI_IN_TREE: INST_LUADIR ($(INST_LUADIR)) is not inside a LuaRocks tree)
endif
override INST_INCDIR = $(ROCK_TREE)/include
override INST_CLIBDIR = $(ROCK_TREE)/lib
override INST_PCDIR = $(ROCK_TREE)/lib/pkgconfig
endif
install-capi: | build
	@mkdir -p build/inst
	@printf '%s\n' 'prefix=$(PC_PREFIX)' 'includedir=$(INST_INCDIR)' 'libdir=$(INST_CLIBDIR)' '' \
	  'Name: lecho' 'Description: event channels between processes (C API; LuaJIT inside)' \
	  'Version: $(LECHO_VERSION)' 'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -llecho' \
	  'Libs.private: $(LECHO_LIBS)' > build/inst/lecho.pc
	$(CC) $(ALLCFLAGS) -shared -Wl,-soname,liblecho.so.0 -o build/inst/liblecho.so.0 $(LECHO_SRC) \
	  -DLECHO_LUA_DIR='"$(RUN_LUADIR)"' -DLECHO_LUA_CDIR='"$(RUN_LIBDIR)"' $(LECHO_LIBS) $(LDFLAGS)
	mkdir -p $(DESTDIR)$(INST_INCDIR) $(DESTDIR)$(INST_CLIBDIR) $(DESTDIR)$(INST_PCDIR)
	cp core/lecho.h $(DESTDIR)$(INST_INCDIR)/lecho.h
	cp build/inst/liblecho.so.0 $(DESTDIR)$(INST_CLIBDIR)/liblecho.so.0
	ln -sf liblecho.so.0 $(DESTDIR)$(INST_CLIBDIR)/liblecho.so
	cp build/inst/lecho.pc $(DESTDIR)$(INST_PCDIR)/lecho.pc

# The Python package (python/lecho) where Debian's python3 finds it: for
# PREFIX=/usr/local, /usr/local/lib/python3.X/dist-packages (on sys.path);
# under another PREFIX, set PYTHONPATH=INST_PYDIR.  lecho/_paths.py names
# the installed liblecho and the directory of the installed scripts
# (lecho.keygen runs lecho-keygen from there, PATH or not).
PY_MINOR   := $(shell $(PYTHON) -c 'import sys; print(sys.version_info[1])' 2>/dev/null || echo 11)
INST_PYDIR ?= $(PREFIX)/lib/python3.$(PY_MINOR)/dist-packages
install-python:
	mkdir -p $(DESTDIR)$(INST_PYDIR)/lecho
	cp python/lecho/__init__.py python/lecho/_ffi.py python/lecho/_values.py $(DESTDIR)$(INST_PYDIR)/lecho/
	printf '%s\n' '# written by make install: the liblecho this package loads' \
	  'LIBRARY = "$(INST_CLIBDIR)/liblecho.so.0"' 'BINDIR = "$(INST_BINDIR)"' \
	  > $(DESTDIR)$(INST_PYDIR)/lecho/_paths.py

# The C example (examples/c/heat.c) built the way a user builds against an
# installed lecho: install into EXAMPLE_PREFIX (build/stage), then cc with
# pkg-config from there.  Run: examples/c/heat, with examples/c/viewer.lua.
EXAMPLE_PREFIX ?= $(CURDIR)/build/stage
examples-c: $(SO)
	$(MAKE) install PREFIX=$(EXAMPLE_PREFIX) DESTDIR= INST_LIBDIR=$(EXAMPLE_PREFIX)/lib/lua/5.1 \
	  INST_LUADIR=$(EXAMPLE_PREFIX)/share/lua/5.1 INST_BINDIR=$(EXAMPLE_PREFIX)/bin \
	  INST_INCDIR=$(EXAMPLE_PREFIX)/include INST_CLIBDIR=$(EXAMPLE_PREFIX)/lib
	$(CC) $(CFLAGS) $(WARN) -o examples/c/heat examples/c/heat.c \
	  $$(PKG_CONFIG_PATH=$(EXAMPLE_PREFIX)/lib/pkgconfig pkg-config --cflags --libs lecho) \
	  -Wl,-rpath,$(EXAMPLE_PREFIX)/lib -lm

.PHONY: install-capi

# luarocks make (rockspec/): the rock's own core, built afresh with the flags
# LuaRocks gives, never the tree's $(SO) of an earlier `make`.  A user's compiler builds it without -Werror: a warning a newer
# compiler adds must not fail an install (the tree's own builds keep -Werror).
ROCK_SO := build/rock/core.so
.PHONY: rock
rock:
	rm -rf $(dir $(ROCK_SO))
	mkdir -p $(dir $(ROCK_SO))
	$(MAKE) -j$(BUILD_JOBS) all SO=$(ROCK_SO) WS_SO=$(dir $(ROCK_SO))ws.so OBJ_DIR=$(dir $(ROCK_SO))obj LIBLECHO_ALL= \
	  WARN="-Wall -Wextra -std=gnu99"

# make rock-pack: lecho-$(ROCK_VERSION)-1.src.rock (in ROCK_OUT, default the
# checkout) from this checkout's HEAD commit, offline.  The rockspec's source
# is its public git URL (a placeholder until the project is published) at tag
# v$(ROCK_VERSION); `luarocks pack` is pointed, through git's url.insteadOf, at
# a temporary clone of HEAD tagged v$(ROCK_VERSION) (uncommitted changes are not in it).
ROCK_VERSION = 0.1.0
ROCK_OUT ?= $(CURDIR)
ROCK_SPEC = $(CURDIR)/rockspec/lecho-$(ROCK_VERSION)-1.rockspec
.PHONY: rock-pack
rock-pack:
	@url=$$(sed -n 's/^source = { url = "git+\([^"]*\)".*/\1/p' $(ROCK_SPEC)); \
	test -n "$$url" || { echo "make rock-pack: no git+ source url in $(ROCK_SPEC)" >&2; exit 1; }; \
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	git clone -q "$(CURDIR)" "$$tmp/repo" && git -C "$$tmp/repo" tag -f v$(ROCK_VERSION) >/dev/null && \
	mkdir -p "$(ROCK_OUT)" && cd "$(ROCK_OUT)" && \
	GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0="url.file://$$tmp/repo.insteadOf" GIT_CONFIG_VALUE_0="$$url" \
	luarocks --lua-version=5.1 pack $(ROCK_SPEC) && \
	echo "make rock-pack: $(ROCK_OUT)/lecho-$(ROCK_VERSION)-1.src.rock (HEAD $$(git -C $(CURDIR) rev-parse --short HEAD))"

clean:
	rm -rf build $(SO) $(WS_SO) lua/lecho/codec.so $(BENCH_BIN) examples/c/heat

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
	  $(if $(SCENARIO),--scenario $(SCENARIO)) $(if $(MODE),--mode $(MODE)) --keep
