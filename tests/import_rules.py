"""An import-linter contract type that lists what a package MAY import (``lint-imports``, ``pyproject.toml``).

import-linter's own ``forbidden`` contract names what may not be imported, so a package added to ``engine``
is open to the GUI until someone remembers to forbid it.  ``allowed`` turns that round: every direct import
from ``source_modules`` into ``within`` must be one of ``allowed_modules`` (or a module inside one).
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output


class AllowedContract(Contract):
    type_name = "allowed"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    within = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.ModuleField())
    ignore_imports = fields.ListField(subfield=fields.StringField(), required=False)  # "importer -> imported"

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        allowed = [m.name for m in self.allowed_modules]  # type: ignore[attr-defined]
        within = [m.name for m in self.within]  # type: ignore[attr-defined]
        ignored = {tuple(part.strip() for part in rule.split("->")) for rule in self.ignore_imports or []}  # type: ignore[attr-defined,union-attr]

        def inside(module: str, packages: list[str]) -> bool:
            return any(module == p or module.startswith(p + ".") for p in packages)

        broken: list[tuple[str, str, int | None]] = []
        for source in self.source_modules:  # type: ignore[attr-defined]
            for importer in sorted({source.name} | graph.find_descendants(source.name)):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if (importer, imported) in ignored:
                        continue
                    if inside(imported, within) and not inside(imported, allowed):
                        details = graph.get_import_details(importer=importer, imported=imported)
                        broken.append((importer, imported, details[0]["line_number"] if details else None))
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, line in check.metadata["broken"]:
            output.print_error(f"{importer} imports {imported} (line {line}), which is not on the allowed list")
            output.new_line()
