"""Minimal shim so that legacy tooling (`python setup.py develop`) works; metadata lives in pyproject.toml."""
from setuptools import setup

setup()
