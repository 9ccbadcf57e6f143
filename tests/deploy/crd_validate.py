"""Validate Prometheus Operator objects against the operator's CRDs, strictly, offline.

    PYTHONPATH=build/k8s-schemas python tests/deploy/crd_validate.py < objects.json

Reads a JSON list of objects; prints a JSON list, one entry per object: ``{"kind", "name",
"errors": [...], "schema": "<package> <version>"}``. The schemas are
cloudcoil-models-prometheus-operator's models (pydantic, generated from the operator's
published CRDs; .ci/k8s-deps.sh installs them beside, not into, the test environment). Strict:

- a kind with no model is an error (a missing schema is a failure, not a warning);
- the object must validate against its model in pydantic's strict mode (no "5" for 5, an
  enum's value only, every required field);
- a field the CRD does not declare is an error (the models would ignore it: each object is
  dumped again and every key that did not survive is named).
"""

from __future__ import annotations

import json
import sys
from importlib import metadata

PACKAGE = "cloudcoil-models-prometheus-operator"
GROUPS = {
    "monitoring.coreos.com/v1": "cloudcoil.models.prometheus_operator.v1",
    "monitoring.coreos.com/v1alpha1": "cloudcoil.models.prometheus_operator.v1alpha1",
}


def unknown_keys(given, kept, where: str = "") -> list[str]:
    """The paths of keys in ``given`` that ``kept`` (its validated dump) lost."""
    found = []
    if isinstance(given, dict) and isinstance(kept, dict):
        for key, value in given.items():
            path = f"{where}.{key}" if where else key
            if key not in kept:
                found.append(f"{path}: not a field of the CRD's schema")
            else:
                found += unknown_keys(value, kept[key], path)
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (value, dumped) in enumerate(zip(given, kept, strict=False)):
            found += unknown_keys(value, dumped, f"{where}[{i}]")
    return found


def check(obj: dict) -> list[str]:
    """What is wrong with ``obj`` (empty: valid)."""
    import importlib

    import pydantic

    module_name = GROUPS.get(obj.get("apiVersion"))
    kind = obj.get("kind")
    model = getattr(importlib.import_module(module_name), kind, None) if module_name else None
    if not isinstance(model, type) or not issubclass(model, pydantic.BaseModel):
        return [f"no schema for {obj.get('apiVersion')} {kind} in {PACKAGE}"]
    try:
        validated = model.model_validate(obj, strict=True)
    except pydantic.ValidationError as error:
        return [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors()]
    kept = validated.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return unknown_keys(obj, kept)


def main() -> int:
    objects = json.load(sys.stdin)
    version = f"{PACKAGE} {metadata.version(PACKAGE)}"
    results = []
    for obj in objects:
        name = (obj.get("metadata") or {}).get("name")
        results.append({"kind": obj.get("kind"), "name": name, "errors": check(obj),
                        "schema": version})  # fmt: skip
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
