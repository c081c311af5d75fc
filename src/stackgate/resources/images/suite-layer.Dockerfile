# The suite's own requirements (its requirements files, --suite-install) as a thin layer on top of
# a stack image (rendered by src/stackgate/backends/docker/images.py): built on the runner, FROM the
# stack image it was given (its id is in the labels), so the stack image and its digest never change
# with the suite. Its SBOM (pip freeze) is rewritten to include the suite's packages. The wheels come
# from the same throw-away loopback server as the stack image's (build argument {{WHEELS}}): none
# stays in the layer.
FROM {{PARENT}}
ARG {{WHEELS}}
RUN {{VENV}}/bin/pip install --no-index --no-cache-dir --find-links "${{{WHEELS}}}" {{SUITE_REQUIREMENTS}} \
 && {{VENV}}/bin/pip check \
 && {{VENV}}/bin/pip freeze --all > {{PIP_FREEZE}}
LABEL {{LABELS}}
