"""Build hook only (metadata, dependencies and options are in setup.cfg): a wheel or a non-editable install carries
the CUDA sources as cuflash/cuda_src/, because the kernels compile at run time (cuflash._compile.SRC_DIR). An
editable install reads them from the checkout's cuda_src/ instead."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithSources(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            shutil.copytree(Path(__file__).parent / "cuda_src", Path(self.build_lib) / "cuflash" / "cuda_src",
                            dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithSources})
