#!/bin/bash
set -e
sed -i 's/^def answer()$/def answer():/' /app/calc.py
