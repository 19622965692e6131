"""Bounded YAML reading for strategy documents.

A strategy arrives from a browser or a CI pipeline, so reading it must cost little
whatever it holds: the size is checked before the parser sees a byte, anchors and
aliases are refused while composing (so an alias bomb is never expanded), nesting is
capped, and duplicate keys (which PyYAML would silently resolve to the last one) are
refused with their dotted path.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpu_runtime.errors import DOCUMENT_KEY, StrategyError

MAX_DOCUMENT_BYTES = 64 * 1024
MAX_DEPTH = 32


class _Refused(Exception):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


def _line(event_or_node: Any) -> str:
    mark = getattr(event_or_node, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


class _StrategyLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases and caps nesting while composing."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001 - PyYAML's signature
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                DOCUMENT_KEY,
                f"YAML aliases (*{event.anchor}) are not allowed in a strategy{_line(event)}",
            )
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            raise _Refused(
                DOCUMENT_KEY,
                f"YAML anchors (&{anchor}) are not allowed in a strategy{_line(event)}",
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(DOCUMENT_KEY, f"nesting deeper than {MAX_DEPTH} levels{_line(event)}")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_duplicate_keys(node: yaml.Node, path: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            dotted = f"{path}.{key}" if path else key
            if key in seen:
                raise _Refused(dotted, f"duplicate key{_line(key_node)}")
            seen.add(key)
            _check_duplicate_keys(value_node, dotted)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, f"{path}.{i}" if path else str(i))


def _as_text(document: str | bytes) -> str:
    if isinstance(document, bytes | bytearray):
        if len(document) > MAX_DOCUMENT_BYTES:
            raise StrategyError.single(
                DOCUMENT_KEY,
                f"document is {len(document)} bytes; the limit is {MAX_DOCUMENT_BYTES}",
            )
        try:
            return bytes(document).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrategyError.single(
                DOCUMENT_KEY, f"document is not UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    if not isinstance(document, str):
        raise StrategyError.single(
            DOCUMENT_KEY, f"expected YAML text, got {type(document).__name__}"
        )
    # A str is at least as many bytes as characters, so a long one is refused before encoding it.
    size = len(document) if len(document) > MAX_DOCUMENT_BYTES else len(document.encode("utf-8"))
    if size > MAX_DOCUMENT_BYTES:
        raise StrategyError.single(DOCUMENT_KEY, f"document is over {MAX_DOCUMENT_BYTES} bytes")
    return document


def read_strategy_yaml(document: str | bytes) -> dict[str, Any]:
    """Parse a strategy document into plain data, or raise StrategyError naming the problem."""
    text = _as_text(document)
    loader = None
    try:
        loader = _StrategyLoader(text)  # the reader checks characters here already
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_duplicate_keys(node, "")
        data = loader.construct_document(node)
    except _Refused as exc:
        raise StrategyError.single(exc.key, exc.message) from None
    except yaml.YAMLError as exc:
        raise StrategyError.single(
            DOCUMENT_KEY, f"not valid YAML: {_describe_yaml_error(exc)}"
        ) from None
    except RecursionError:
        raise StrategyError.single(DOCUMENT_KEY, "document nests too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise StrategyError.single(
            DOCUMENT_KEY, f"a strategy is a mapping of sections, got {type(data).__name__}"
        )
    return data


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return (
        f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
        if mark is not None
        else str(problem)
    )
