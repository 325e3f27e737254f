#!/usr/bin/env python3
"""A CLI test agent that hands back fields and files the way agents are told to: it writes
report.md and data.csv in its working directory (the task's workspace), makes a symbolic
link `escape` to a file outside it, and answers with FILE: lines (two good, three that must
be refused) and an AAMP_RESULT_JSON block.

    result_agent.py            as above
    result_agent.py --echo     answers with the prompt it was given (stdin), as an agent
                               that repeats its instructions would
"""
import json
import os
import sys

prompt = sys.stdin.read()
if "--echo" in sys.argv:
    print(prompt)
    sys.exit(0)
with open("report.md", "w") as f:
    f.write("# Report\n\nAll good.\n")
with open("data.csv", "w") as f:
    f.write("a,b\n1,2\n")
os.symlink("/etc/hostname", "escape")
result = {
    "output": "Report ready",
    "structuredResult": [
        {"fieldKey": "summary", "fieldTypeKey": "text", "value": "all good"},
        {"fieldKey": "report", "fieldTypeKey": "attachment", "value": ""},
    ],
    "attachments": [{"path": "report.md", "contentType": "text/markdown"}],
}
print("Here is the report.")
print("FILE: data.csv")
print("FILE: ../../etc/passwd")
print("FILE: /etc/passwd")
print("FILE: escape")
print("AAMP_RESULT_JSON:")
print("```json")
print(json.dumps(result))
print("```")
