"""The tables this package returns: the Python resource-tracker 0.5.0's
TinyDataFrame behaviour (a row number gives a row dict, a column name gives the
column's list, a list of names or a slice gives a new table), with no dependency.
`to_pandas()` converts one to a pandas DataFrame in one call.

Kept here rather than depending on pandas: 0.5.0's users index metrics both ways
with or without pandas installed, and a DataFrame answers `df[0]` with a column."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Union

# csv, io and logging are imported where used: the tracked interpreter imports this
# module with the package, and most runs never write a CSV.


class StatSpec(NamedTuple):
    """One statistic of one column, as 0.5.0's `stats(specs=[...])` takes it."""

    column: str
    agg: Callable[[List[Any]], Any]
    agg_name: Optional[str] = None
    round: Optional[int] = None


def _number(text: str) -> Any:
    """A CSV cell as 0.5.0 reads it: int, else float, else the text ('' is None)."""
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _read_csv(path: str, retries: int, delay: float) -> List[Dict[str, Any]]:
    """The rows of a CSV file with a header, tried `retries` more times (the delay
    doubling) while it cannot be read whole; a RuntimeError names the file and the
    last reason, as 0.5.0's."""
    import csv
    import time

    why: Optional[Exception] = None
    for attempt in range(retries + 1):
        try:
            with open(path, newline="") as f:
                rows = list(csv.DictReader(f))
            for n, r in enumerate(rows, start=2):
                if None in r:
                    raise ValueError(f"line {n} has more cells than the header")
            return [{k: _number(v) for k, v in r.items()} for r in rows]
        except (OSError, ValueError, csv.Error) as e:
            why = e
            if attempt < retries:
                time.sleep(delay)
                delay *= 2
    raise RuntimeError(f"Failed to read CSV file after {retries + 1} attempts: {path}: {why}") from why


class TinyDataFrame:
    """Columns of equal length under names, in order.

    Build one from a dict of columns, a list of row dicts (columns in the order first
    seen) or `csv_file_path`; `columns` lists the names."""

    def __init__(
        self,
        data: Union[Dict[str, Sequence[Any]], Sequence[Dict[str, Any]], None] = None,
        csv_file_path: Optional[str] = None,
        columns: Optional[Sequence[str]] = None,
        retries: int = 0,
        retry_delay: float = 0.1,
    ) -> None:
        if data is not None and csv_file_path is not None:
            raise ValueError("TinyDataFrame: give data or csv_file_path, not both")
        if csv_file_path is not None:
            data = _read_csv(csv_file_path, retries, retry_delay)
        self.columns: List[str] = []
        self._data: List[List[Any]] = []
        if isinstance(data, dict):
            self.columns = [str(c) for c in data]
            self._data = [list(v) for v in data.values()]
            lengths = {len(v) for v in self._data}
            if len(lengths) > 1:
                raise ValueError(f"TinyDataFrame: columns of different lengths {sorted(lengths)}")
        elif data is not None:
            rows = list(data)
            names: Dict[str, None] = dict.fromkeys(columns or [])
            if columns is None:
                for r in rows:
                    if not isinstance(r, dict):
                        raise TypeError(f"TinyDataFrame: a row is a {type(r).__name__}, not a dict")
                    names.update(dict.fromkeys(r))
            self.columns = list(names)
            self._data = [[r.get(c) for r in rows] for c in self.columns]
        elif columns is not None:
            self.columns = list(columns)
            self._data = [[] for _ in self.columns]

    def __len__(self) -> int:
        return len(self._data[0]) if self._data else 0

    def _col(self, name: str) -> List[Any]:
        try:
            return self._data[self.columns.index(name)]
        except ValueError:
            raise KeyError(f"Column '{name}' not found") from None

    def __getitem__(self, key: Union[str, int, slice, Sequence[str]]) -> Any:
        if isinstance(key, str):
            return self._col(key)
        if isinstance(key, bool):
            raise TypeError("TinyDataFrame: a row number or a column name, not a bool")
        if isinstance(key, int):
            n = len(self)
            if not -n <= key < n:
                raise IndexError(f"row {key} of a table of {n} rows")
            return {c: v[key] for c, v in zip(self.columns, self._data)}
        if isinstance(key, slice):
            return TinyDataFrame({c: v[key] for c, v in zip(self.columns, self._data)})
        if isinstance(key, (list, tuple)) and all(isinstance(k, str) for k in key):
            return TinyDataFrame({k: list(self._col(k)) for k in key})
        raise TypeError(f"TinyDataFrame: invalid key type {type(key).__name__}")

    def __setitem__(self, key: str, value: Sequence[Any]) -> None:
        if not isinstance(key, str):
            raise TypeError(f"Column name must be a string, got {type(key).__name__}")
        value = list(value)
        if self.columns and len(self) and len(value) != len(self):
            raise ValueError(f"Length of values ({len(value)}) must match dataframe length ({len(self)})")
        if key in self.columns:
            self._data[self.columns.index(key)] = value
        else:
            self.columns.append(key)
            self._data.append(value)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TinyDataFrame):
            return self.columns == other.columns and self._data == other._data
        if isinstance(other, list):
            return self.to_dict() == other
        return NotImplemented

    def head(self, n: int = 5) -> "TinyDataFrame":
        return self[:n]

    def tail(self, n: int = 5) -> "TinyDataFrame":
        return self[-n:] if n > 0 else self[len(self) :]

    def rename(self, columns: Dict[str, str]) -> "TinyDataFrame":
        """Renames in place (and returns the table), as 0.5.0's."""
        for old in columns:
            if old not in self.columns:
                raise KeyError(f"Column '{old}' not found in dataframe")
        self.columns = [columns.get(c, c) for c in self.columns]
        return self

    def to_dict(self) -> List[Dict[str, Any]]:
        """The rows as dicts."""
        return list(self)

    def to_csv(self, csv_file_path: Optional[str] = None, quote_strings: bool = True) -> Optional[str]:
        """The table as CSV (strings quoted, numbers not), to `csv_file_path` or returned."""
        import csv
        import io

        buf = io.StringIO(newline="")
        w = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC if quote_strings else csv.QUOTE_MINIMAL)
        w.writerow(self.columns)
        for i in range(len(self)):
            w.writerow(["" if v[i] is None else v[i] for v in self._data])
        text = buf.getvalue()
        if csv_file_path is None:
            return text
        with open(csv_file_path, "w", newline="") as f:
            f.write(text)
        return None

    def to_pandas(self) -> Any:
        """A pandas DataFrame of the same columns, in order."""
        try:
            import pandas as pd
        except ImportError as e:
            raise ImportError("to_pandas() needs pandas: pip install pandas") from e
        return pd.DataFrame({c: v for c, v in zip(self.columns, self._data)}, columns=self.columns)

    def stats(self, specs: Sequence[StatSpec]) -> Dict[str, Dict[str, Any]]:
        """{column: {agg_name: value}} for each spec, over the column's values that
        are not None. A column missing is a KeyError; an aggregation that fails
        is logged and left out."""
        out: Dict[str, Dict[str, Any]] = {}
        for spec in specs:
            name = spec.agg_name or getattr(spec.agg, "__name__", "agg")
            values = [v for v in self._col(spec.column) if v is not None]
            try:
                v = spec.agg(values)
            except Exception as e:
                # As 0.5.0: the statistic is left out and said, the others still made.
                import logging

                logging.getLogger(__name__).error("stats: %s of column %r: %s", name, spec.column, e)
                continue
            out.setdefault(spec.column, {})[name] = round(v, spec.round) if spec.round is not None else v
        return out

    def __repr__(self) -> str:
        first = self[0] if len(self) else {}
        return f"TinyDataFrame with {len(self)} rows and {len(self.columns)} columns. First row as a dict: {first}"

    def __str__(self) -> str:
        head = f"TinyDataFrame with {len(self)} rows and {len(self.columns)} columns:\n"
        if not len(self):
            return head + "Empty dataframe"
        shown = min(10, len(self))
        cells = [[str(v[i]) for v in self._data] for i in range(shown)]
        widths = [max([len(c)] + [len(r[j]) for r in cells]) for j, c in enumerate(self.columns)]
        lines = [" | ".join(c.ljust(w) for c, w in zip(self.columns, widths))]
        lines.append("-+-".join("-" * w for w in widths))
        for r, raw in zip(cells, range(shown)):
            parts = []
            for j, text in enumerate(r):
                v = self._data[j][raw]
                numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
                parts.append(text.rjust(widths[j]) if numeric else text.ljust(widths[j]))
            lines.append(" | ".join(parts))
        if len(self) > shown:
            lines.append("...")
        return head + "\n".join(lines)
