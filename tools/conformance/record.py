#!/usr/bin/env python3
"""Joins the cases and Megatron's verdicts into the file kept in the repository, so that the
comparison with capscope-check runs anywhere (CI included) without torch or Megatron.

usage: record.py --cases cases.jsonl --megatron megatron.jsonl > megatron-COMMIT-verdicts.jsonl
"""
import argparse
import json


def main():
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--cases", required=True)
    cli.add_argument("--megatron", required=True)
    options = cli.parse_args()
    verdicts = {r["id"]: r for r in map(json.loads, open(options.megatron))}
    for case in map(json.loads, open(options.cases)):
        print(json.dumps({**case, "megatron": verdicts[case["id"]]}, sort_keys=True))


if __name__ == "__main__":
    main()
