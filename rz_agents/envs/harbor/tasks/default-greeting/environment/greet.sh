#!/bin/bash
echo "Hello, $NAME"
