# The two commands a newcomer needs: `make up` (set up and serve) and `make test` (set up and pass the tests).
VENV ?= .venv
JANUS := $(VENV)/bin/janus

.PHONY: setup up test test-fast bench lint clean image image-cuda clients

setup:
	@./scripts/setup.sh

up: setup
	$(JANUS) up $(if $(CONFIG),--config $(CONFIG),) $(if $(PORT),--port $(PORT),) $(UP_ARGS)

# guidellm and aiperf, from PyPI, against a running gateway (`make up` in another shell; GATEWAY= another one):
# docs/benchmarks.md, "Real clients"
clients: setup
	$(VENV)/bin/python bench/clients.py $(if $(GATEWAY),--gateway $(GATEWAY),) $(CLIENTS_ARGS)

test: setup
	$(VENV)/bin/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(VENV)/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)

# the images deploy/k8s and docker-compose run (docs/operations.md): CPU, and CUDA for GPU hosts
image:
	docker build -t janus:dev .

image-cuda:
	docker build -f Dockerfile.cuda -t janus:cuda .

lint: setup
	$(VENV)/bin/lint-imports

clean:
	rm -rf .janus .pytest_cache
