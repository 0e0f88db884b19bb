"""The one compiled part of trainfeed: JPEG region decoding (trainfeed/decode/_jpeg_region.c).

Everything else is declared in pyproject.toml. The extension links libjpeg-turbo, whose headers
the build needs (Debian/Ubuntu: libjpeg-dev or libjpeg62-turbo-dev; Fedora: libjpeg-turbo-devel;
macOS: brew install jpeg-turbo). Without them the install still succeeds and crops are decoded
from whole images, about 1.3x slower on ImageNet-like training crops: `trainfeed doctor` says
which, and the reader warns once.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("trainfeed.decode._jpeg_region", ["trainfeed/decode/_jpeg_region.c"],
                             libraries=["jpeg"], extra_compile_args=["-O2"], optional=True)])
