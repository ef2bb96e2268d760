"""Sources to records: three shapes in three formats, and every kind of bad input named by file and line."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mlops.data.records import Issue, Record, SourceChangedError, read_source, record_id
from mlops.files import file_sha256

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                     {"role": "assistant", "content": "Hello."}], "domain": "safety"}
INSTRUCTION = {"instruction": "Summarise.", "input": "Long ticket text.", "output": "Short."}
TEXT = {"text": "Knowledge base article."}


def read(path, fmt="jsonl", domain="general"):
    return list(read_source(path, path.name, fmt, domain, file_sha256(path)))


def test_three_shapes_become_one_record_type(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (CHAT, INSTRUCTION, TEXT)) + "\n")
    chat, instruction, text = read(path, domain="domain")
    assert isinstance(chat, Record) and chat.kind == "chat" and chat.domain == "safety" and chat.line == 1
    assert instruction.kind == "instruction" and instruction.domain == "domain"  # source default
    assert instruction.messages == [{"role": "user", "content": "Summarise.\n\nLong ticket text."},
                                    {"role": "assistant", "content": "Short."}]
    assert text.kind == "text" and text.messages == [{"role": "text", "content": "Knowledge base article."}]
    assert chat.record_id == record_id("chat", chat.messages)  # content id: stable across files and lines
    again = tmp_path / "again.jsonl"
    again.write_text("\n" + json.dumps(CHAT) + "\n")
    assert read(again)[0].record_id == chat.record_id


def test_parquet_and_csv_sources(tmp_path):
    pq = tmp_path / "ins.parquet"
    pd.DataFrame([INSTRUCTION, {**INSTRUCTION, "output": "Other."}]).to_parquet(pq)
    rows = read(pq, "parquet")
    assert [r.line for r in rows] == [1, 2] and all(r.kind == "instruction" for r in rows)
    csv = tmp_path / "legacy.csv"
    pd.DataFrame({"messages": [json.dumps(CHAT["messages"])], "domain": ["domain"]}).to_csv(csv, index=False)
    (record,) = read(csv, "csv")
    assert record.kind == "chat" and record.domain == "domain" and record.line == 2


@pytest.mark.parametrize(
    ("raw", "field", "problem", "code"),
    [
        (b'{"messages": [', "", "malformed JSON", "malformed_json"),
        ('{"text": "caf\u00e9"}'.encode("latin-1"), "", "not UTF-8: byte 0xe9 at column 14", "not_utf8"),
        (b'{"question": "q", "answer": "a"}', "", "unknown record shape with keys [answer, question]", "unknown_shape"),
        (b'{"instruction": "Summarise", "input": "x"}', "output", "missing field 'output'", "missing_field"),
        (b'{"messages": [{"role": "bot", "content": "x"}]}', "messages[0].role", "unknown role 'bot'", "unknown_role"),
        (b'{"messages": [{"role": "user"}]}', "messages[0].content", "missing field 'content'", "missing_field"),
        (b'{"text": 42}', "text", "'text' is an int", "wrong_type"),
        (b'[1, 2]', "", "must be a JSON object", "wrong_type"),
        (b'{"messages": [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi"}]}',
         "messages[0].role", "starts with an assistant turn", "role_order"),
        (b'{"messages": [{"role": "user", "content": "Hi"}, {"role": "system", "content": "Be terse."}]}',
         "messages[1].role", "system turn (messages[1]) follows", "role_order"),
    ],
)
def test_bad_rows_are_reported_with_file_line_field_and_code(tmp_path, raw, field, problem, code):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(TEXT).encode() + b"\n" + raw + b"\n" + json.dumps(TEXT).encode() + b"\n")
    good1, issue, good2 = read(path)
    assert isinstance(good1, Record) and isinstance(good2, Record) and good2.line == 3
    assert isinstance(issue, Issue) and (issue.file, issue.line, issue.field) == ("bad.jsonl", 2, field)
    assert problem in issue.problem and issue.code == code
    assert issue.message().startswith("bad.jsonl, line 2") and "Fix:" in issue.message()


def test_issue_messages_quote_no_value_and_excerpts_are_redacted(tmp_path):
    path = tmp_path / "pii.jsonl"
    rows = [{"text": ["mail jane.doe@example.com", "call +1 415 555 0132"]},
            {"messages": "jane.doe@example.com is not a list"},
            {"messages": [{"role": "jane.doe@example.com", "content": "x"}]},
            '{"text": "jane.doe@example.com and then it breaks',
            {"jane.doe@example.com": "a dict keyed by an address"},
            {"messages": [{"role": "Jane Doe", "content": "x"}]}]
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    issues = read(path)
    assert len(issues) == 6 and all(isinstance(i, Issue) for i in issues)
    for issue in issues:
        text = json.dumps(issue.as_dict())
        assert "jane.doe" not in text and "555 0132" not in text and "Jane Doe" not in issue.problem, text
    assert "[EMAIL]" in issues[0].excerpt and "[PHONE]" in issues[0].excerpt


def test_empty_source_is_reported(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    (issue,) = read(path)
    assert "empty" in issue.problem and issue.file == "empty.jsonl" and issue.code == "empty_source"


def test_csv_cell_over_the_csv_modules_limit_is_a_record_not_a_crash(tmp_path):
    import csv as csv_module

    path = tmp_path / "big.csv"
    huge = "x " * 200_000  # 400 kB, past csv's 128 KiB field limit
    pd.DataFrame({"text": ["short one", huge, "after it"]}).to_csv(path, index=False)
    before = csv_module.field_size_limit()
    first, big, after = read(path, "csv")
    assert [r.line for r in (first, big, after)] == [2, 3, 4] and len(big.text) == len(huge)
    assert csv_module.field_size_limit() == before  # the process-wide limit is restored


def test_truncated_parquet_keeps_nothing_it_cannot_read_and_reports_it(tmp_path):
    path = tmp_path / "cut.parquet"
    pd.DataFrame([{**INSTRUCTION, "output": f"answer {i}"} for i in range(50)]).to_parquet(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    (issue,) = read(path, "parquet")
    assert issue.code == "unreadable_file" and "cannot be read past row 0" in issue.problem


def test_source_changed_while_reading_stops_the_build(tmp_path):
    path = tmp_path / "live.jsonl"
    path.write_text("\n".join(json.dumps({"text": f"record {i}"}) for i in range(5)) + "\n")
    rows = read_source(path, "live.jsonl", "jsonl", "general", file_sha256(path))
    assert next(rows).line == 1
    with path.open("a") as fh:  # another process appends while we read
        fh.write(json.dumps({"text": "late record"}) + "\n")
    with pytest.raises(SourceChangedError, match=r"live.jsonl' changed while it was being read \(noticed after line 6"):
        list(rows)
    stale = read_source(path, "live.jsonl", "jsonl", "general", "0" * 64)  # changed after it was hashed
    with pytest.raises(SourceChangedError):
        list(stale)


def test_exports_with_a_bom_semicolons_tabs_or_one_json_array_are_read(tmp_path):
    chat_cell = json.dumps(CHAT["messages"])
    semicolons = tmp_path / "excel.csv"
    semicolons.write_bytes(b"\xef\xbb\xbf" + f'messages;domain\n"{chat_cell.replace(chr(34), chr(34) * 2)}";domain\n'.encode())
    (record,) = read(semicolons, "csv")
    assert record.kind == "chat" and record.domain == "domain"
    tabs = tmp_path / "export.tsv"
    tabs.write_text("instruction\tinput\toutput\nSummarise.\tLong ticket text.\tShort.\n")
    (record,) = read(tabs, "csv")
    assert record.kind == "instruction" and record.messages[1]["content"] == "Short."
    bom_jsonl = tmp_path / "bom.jsonl"
    bom_jsonl.write_bytes(b"\xef\xbb\xbf" + json.dumps(TEXT).encode() + b"\n")
    assert isinstance(read(bom_jsonl)[0], Record)
    array = tmp_path / "records.json"
    array.write_text(json.dumps([CHAT, INSTRUCTION, {"question": "?"}], indent=2))
    chat, instruction, issue = read(array)
    assert (chat.kind, instruction.kind, issue.code, issue.line) == ("chat", "instruction", "unknown_shape", 3)
