# Build and install ctcache (docs/operations/install.md).
#
#   make build                    release build of ctcached, ctcachectl and the onnxruntime worker
#   sudo make install             binaries, systemd units, sysusers/tmpfiles,
#                                 example config, man pages, docs
#   make install DESTDIR=/tmp/pkg PREFIX=/usr   staged install for packaging
#   sudo make uninstall
#
# Variables: PREFIX (default /usr/local), DESTDIR, BINDIR, UNITDIR, SYSUSERSDIR,
# TMPFILESDIR, MANDIR, DOCDIR, DATADIR, BUILD_DIR, POSTINSTALL; their meaning
# and defaults are in scripts/install.sh. `make install` does not build:
# run `make build` first (as the user that owns the checkout).

CARGO ?= cargo
PREFIX ?= /usr/local
DESTDIR ?=

# Only variables set on the command line or in the environment are passed on;
# install.sh computes the rest from PREFIX.
INSTALL_VARS = PREFIX="$(PREFIX)" DESTDIR="$(DESTDIR)" \
	$(foreach v,BINDIR UNITDIR SYSUSERSDIR TMPFILESDIR MANDIR DOCDIR DATADIR BUILD_DIR POSTINSTALL,$(if $($(v)),$(v)="$($(v))"))

.PHONY: all build install uninstall

all: build

build:
	$(CARGO) build --release --locked -p ctcached -p ctcachectl -p ctcache-onnxruntime-worker -p ctcache-openvino-worker --bins

install:
	scripts/install.sh install $(INSTALL_VARS)

uninstall:
	scripts/install.sh uninstall $(INSTALL_VARS)
