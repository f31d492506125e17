"""load_dataset: packaged sets and user files to {"id", "question", "answer"}."""

import json

import pytest

from rz_agents.data import DATASETS, DatasetError, load_dataset

SIZES = {
    "aime24": 30,
    "aime25": 30,
    "aime26": 30,
    "amc23": 40,
    "math500": 500,
    "gsm8k": 1319,
    "math_numeric_3k": 3000,
}


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_packaged_sets_load_with_unique_ids_and_nonempty_fields(name):
    rows = load_dataset(name)
    assert len(rows) == SIZES[name]
    assert all(set(r) == {"id", "question", "answer"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["question"].strip() and r["answer"] for r in rows)


def test_known_answers_and_alias():
    assert load_dataset("aime2025")[0]["answer"] == "70"
    assert load_dataset("gsm8k", limit=1)[0]["answer"] == "18"


def test_user_jsonl_with_field_map(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "1+1?", "target": 2}\n\n{"prompt": "2+2?", "target": 4, "uid": "x"}\n')
    rows = load_dataset(path, field_map={"question": "prompt", "answer": "target", "id": "uid"})
    assert rows == [
        {"id": "mine-0", "question": "1+1?", "answer": "2"},
        {"id": "x", "question": "2+2?", "answer": "4"},
    ]


def test_user_json_list(tmp_path):
    path = tmp_path / "l.json"
    path.write_text(json.dumps([{"question": "q", "answer": "a"}]))
    assert load_dataset(str(path)) == [{"id": "l-0", "question": "q", "answer": "a"}]


def test_missing_field_names_record_and_suggests_field_map(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{"question": "q2"}\n')
    with pytest.raises(DatasetError, match=r"record 1 has no 'answer'.*field_map"):
        load_dataset(path)


def test_bad_json_line_and_unknown_name_are_clear_errors(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "q", "answer": "a"}\n{oops\n')
    with pytest.raises(DatasetError, match="broken.jsonl:2: invalid JSON"):
        load_dataset(path)
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        load_dataset("nope")
    with pytest.raises(DatasetError, match="field_map keys"):
        load_dataset("aime24", field_map={"prompt": "x"})


def test_parquet_needs_pyarrow_or_reads(tmp_path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path = tmp_path / "d.parquet"
        path.write_bytes(b"PAR1")
        with pytest.raises(DatasetError, match="pyarrow"):
            load_dataset(path)
        return
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["q"], "answer": [3]}), path)
    assert load_dataset(path) == [{"id": "d-0", "question": "q", "answer": "3"}]
