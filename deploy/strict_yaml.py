"""YAML for files written by hand: PyYAML's safe loader, refusing a key given twice in one mapping.

PyYAML keeps the last of duplicate keys without a word, so a profile or schedule that says
``every_epochs`` (or ``workers``) twice would run with whichever came last."""

from __future__ import annotations

from typing import Any

import yaml


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader whose mappings refuse a duplicate key, naming it and its line."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice (line {key_node.start_mark.line + 1}); keep one", None)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` that raises ``yaml.YAMLError`` on a key given twice in one mapping."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
