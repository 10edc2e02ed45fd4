"""`promote` and `prune`: move tested images between registries by digest, and retire old nightlies."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..generate.plan import Plan
from ..model.registry import Registry
from ..names import PUBLISHED_NAME
from ..run.shipping import promote as promoting, prune as pruning
from ..run import registry as registries
from .common import flavour_filters, plan_options, published_option, say, select


@click.command("promote")
@click.argument("names", nargs=-1, metavar="[FLAVOURS]...")
@click.option("--from", "source_text", metavar="HOST[:PORT]/REPO", required=True, help="Where the tested images are.")
@click.option("--to", "destination_text", metavar="HOST[:PORT]/REPO", required=True, help="Where to copy them.")
@published_option("Record of pushes and promotions")
@click.option("--chunk-mb", type=click.IntRange(1, 1024), default=promoting.DEFAULT_CHUNK >> 20, show_default=True,
              help="Size of each PATCH when a blob is streamed between registries.")
@flavour_filters
@plan_options
def promote(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None], source_text: str,
            destination_text: str, published_path: Path | None, chunk_mb: int) -> None:
    """Copy flavour images from one registry to another by digest: no rebuild, no pull.

    \b
    Over the registry API: blobs are mounted across repositories on the same host, streamed registry to
    registry otherwise; then the manifest goes up byte for byte under the flavour's tags, and every tag's
    digest at the destination must equal the source's. A flavour missing at the source fails the run before
    anything is written. published.json records each copy (`promotions`).

    \b
    Examples:
      build.py promote r2.9.0_3.11_cpu --from staging.example:5000/xla --to prod.example/ml/xla
      build.py promote --python 3.11 --from 127.0.0.1:5000/staging --to 127.0.0.1:5000/xla-images
    """
    flavours = select(plan, names, filters)
    source_registry = Registry.parse(source_text, where="--from")
    destination_registry = Registry.parse(destination_text, where="--to")
    named = (source_registry.host, destination_registry.host)  # the environment's credentials may go to either
    source = registries.connect(source_registry, named=named)
    same_host = source_registry.host == destination_registry.host  # a cross-repository mount reads the source
    destination = registries.connect(destination_registry, registries.WRITE, named=named,
                                     also_read=source_registry if same_host else None)
    path = published_path or plan.root / PUBLISHED_NAME
    with registries.redacting(source.credentials, destination.credentials):
        done = promoting.promote(flavours, source, destination, path, chunk_size=chunk_mb << 20, progress=say)
    for item in done:
        click.echo(f"{item.tag}\t{item.destination_ref}\t{json.dumps(item.transfer.to_json())}")
    say(f"{len(done)} flavour(s) promoted and verified; recorded in {path}")


@click.command("prune")
@click.option("--registry", "registry_text", metavar="HOST[:PORT]/REPO", default=None,
              help="The repository to prune (default: the site's registry).")
@click.option("--keep", type=click.IntRange(0, pruning.MAX_KEEP), required=True,
              help="Dated nightly tags always kept per series (the newest N).")
@click.option("--older-than", "older_than", type=click.IntRange(0, pruning.MAX_AGE_DAYS), required=True, metavar="DAYS",
              help="Of the rest, delete those whose date is more than DAYS days ago.")
@click.option("--dry-run", is_flag=True, help="Say what would go; delete nothing, collect nothing.")
@click.option("--protect", "protect_files", type=click.Path(path_type=Path), multiple=True, metavar="FILE",
              help="Digests never to delete: one sha256:… or REF@sha256:… per line, or a published.json. Repeatable.")
@published_option("Its digests are protected too")
@click.option("--gc/--no-gc", "collect", default=True, show_default=True,
              help="Run the registry's garbage collection afterwards where the registry is ours.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@plan_options
def prune(plan: Plan, registry_text: str | None, keep: int, older_than: int, dry_run: bool,
          protect_files: tuple[Path, ...], published_path: Path | None, collect: bool, as_json: bool) -> None:
    """Delete old dated nightly images (keep N newest per series, delete those older than DAYS).

    \b
    Deletes manifests over the registry API; never a digest published.json records or a --protect file
    names, nor one a non-candidate tag still names. Then, where the registry is the local docker-registry
    that ci/registry.sh runs for its port, stops it, runs `docker-registry garbage-collect
    --delete-untagged`, starts it again and reports blobs and bytes before and after.

    \b
    Examples:
      build.py prune --keep 7 --older-than 14 --dry-run
      build.py prune --keep 3 --older-than 30 --protect downstream-digests.txt
    """
    registry = Registry.parse(registry_text or plan.site.registry,
                              where="--registry" if registry_text else "site registry")
    client = registries.connect(registry, registries.DELETE, named=(registry.host,))
    protected = pruning.protected_digests(published_path or plan.root / PUBLISHED_NAME, protect_files)
    with registries.redacting(client.credentials):
        report = pruning.prune(client, keep=keep, older_than_days=older_than, protected=protected,
                               dry_run=dry_run, collect=collect, progress=say)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
        return
    for decision in report.plan.decisions:
        verb = ("would delete" if dry_run else "deleted") if decision.delete else "kept"
        click.echo(f"{verb}\t{decision.tag}\t{decision.digest}\t{decision.reason}")
    gc = report.collected
    if gc is not None:
        click.echo(f"garbage collection: {gc.before.blobs} -> {gc.after.blobs} blobs, "
                   f"{gc.before.bytes} -> {gc.after.bytes} bytes ({gc.freed} bytes freed)")
    else:
        click.echo(f"garbage collection skipped: {report.gc_skipped}")
    say(f"{len(report.plan.doomed_digests)} manifest(s) {'would be ' if dry_run else ''}deleted, "
         f"{sum(not d.delete for d in report.plan.decisions)} dated tag(s) kept")
