COPY suite-wheels {{SUITE_WHEELS}}
RUN {{VENV}}/bin/pip install --no-index --no-cache-dir --find-links {{SUITE_WHEELS}} {{SUITE_REQUIREMENTS}} \
 && {{VENV}}/bin/pip check \
 && rm -rf {{SUITE_WHEELS}}
