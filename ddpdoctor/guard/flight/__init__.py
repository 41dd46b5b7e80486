"""torch's Flight Recorder, read by the guard: every collective each rank issued, with its sequence id,
shapes, dtypes and Python stack, as the per-rank dumps torch writes (`TORCH_FR_DUMP_TEMP_FILE`).

`dumps` reads them (a dump is untrusted input: a restricted unpickler, bounded sizes), `align` lines the
entries of all ranks up by process group and sequence id and judges them (GRD001, GRD002), `analyze`
is `ddpdoctor guard --analyze DIR`. Nothing here imports torch.
"""
