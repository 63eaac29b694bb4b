"""Maps the user's top-level folders into one import namespace.

broker/ -> automq.broker, operator/ -> automq.operator, spark-jobs/ -> automq.spark.
`operator` is a standard-library module, so the folders cannot be top-level
packages of their own; `automq` is a namespace package that holds all three.
Everything else (metadata, dependencies, scripts) lives in pyproject.toml.
"""

from setuptools import find_packages, setup

ROOTS = {"automq.broker": "broker", "automq.operator": "operator", "automq.spark": "spark-jobs"}

packages = []
for name, folder in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=ROOTS,
    package_data={name: ["py.typed", "**/*.json", "**/*.yaml", "**/*.md"] for name in ROOTS},
)
