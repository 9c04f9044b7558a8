"""The sections of each report page, one module a page: `sae` (SAE metrics per layer and the
L0 controller), `baseline`, `behaviour` (a behaviour's attribution and interventions tables),
`provenance` (the reproducibility checklist) and `gpu_hours` (GPU-hours of a full run). They
read other stages' files through `report.inputs` and build HTML with `report.html`;
`report.stage` writes the pages."""
