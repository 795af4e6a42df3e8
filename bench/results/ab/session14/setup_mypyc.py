import sys
from setuptools import setup
from mypyc.build import mypycify
mods = sys.argv[sys.argv.index('--mods')+1].split(',')
sys.argv = sys.argv[:sys.argv.index('--mods')]
setup(name='imgw_compiled', ext_modules=mypycify(mods, opt_level="3"), packages=[])
