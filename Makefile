# clnn: `make demo` runs the main job, `make test` the whole suite.
# Both create .venv and install clnn into it with the extras they need; nothing else
# is needed on a Debian/Ubuntu machine with Python 3 (no OpenCL driver: the PoCL CPU
# device comes from PyPI).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.clnn-installed

.PHONY: demo test bench clean

$(PY):
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "python3 -m venv failed: installing Debian's python3-venv"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv \
	      && $(PYTHON) -m venv $(VENV); \
	  else \
	    echo "python3 -m venv failed: install python3-venv (sudo apt-get install python3-venv)"; \
	    exit 1; \
	  fi; }

$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[pocl,test,data,plot,mpi,ptx]'
	@touch $@

# the main job: train a dense network on real MNIST digits on the default device
demo: $(STAMP)
	$(PY) -m clnn devices
	@echo
	$(PY) -m clnn train mnist

# one pytest worker per core (pytest-xdist): PoCL compiles a kernel on one thread, and
# compiling the variants the tests force is most of the suite's time (docs/DESIGN.md)
test: $(STAMP)
	$(PY) -m pytest -ra -n auto

# benchmarks: PyTorch and tinygrad from PyPI; CLBlast needs Debian's libclblast-dev
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[pocl,bench]'
	-$(PY) -m pip install -q -e '.[clblast]' || echo "pyclblast not built: apt-get install libclblast-dev"
	$(PY) -m clnn bench

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
