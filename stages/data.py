"""Stage `data`: read every source named in params.yaml (corpora and tasks) into data/raw/<name>/.

A hub id is read from its copy in `data.mirror` when there is one, else from the hub at its pinned
revision; a local source's files are copied. The stages after this one read data/raw only, so DVC
tracks their inputs by content (lib/data/raw.py). A source already in data/raw with the same identity is
kept, so the stage (which DVC always runs, to see edits of local sources) costs seconds when nothing
changed. Writes the metrics JSON: per name, its source, who uses it, where the rows came from, rows per split;
and data/raw/eval_texts.json, each task's evaluation splits and text fields, which `clean` removes from
the LM corpora (lib.data.raw.eval_text_spec).
"""

from lib.core.errors import run_main
from lib.core.io import write_json
from lib.core.stage import open_stage
from lib.data.raw import read_all, up_to_date, write_eval_text_spec
from lib.tasks import check_tasks, field_kinds


def main() -> None:
    stage = open_stage("data", __doc__, inputs={},
                       outputs={"out": "data/raw", "metrics": "metrics/data.json"}, checks=[check_tasks])
    args, params = stage.args, stage.params
    kinds = field_kinds(params.tasks)
    if up_to_date(params, args.out) and args.metrics.is_file():  # the usual case: say so, track nothing
        write_eval_text_spec(params, kinds, args.out)  # a task's evaluation splits or fields may have changed
        print(f"data: every source is in {args.out} already, read with the same identity; nothing to do", flush=True)
        return
    with stage.run() as run:
        report = read_all(params, args.out)
        write_eval_text_spec(params, kinds, args.out)  # after every source is read: a failed stage writes nothing
        write_json(args.metrics, report)
        run.log_summary({f"{name}.rows.{split}": n for name, r in report.items() for split, n in r["rows"].items()})
        run.log_artifact(args.metrics)


if __name__ == "__main__":
    run_main(main)
