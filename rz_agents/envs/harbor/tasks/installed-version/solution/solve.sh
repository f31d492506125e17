#!/bin/bash
set -e
python3 -c 'import numpy; print(numpy.__version__)' > /app/numpy_version.txt
