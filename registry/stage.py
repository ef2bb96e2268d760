"""Wiring, outside the layers: the registry's registration with the core (the `registry:` config section, the CLI)."""

from __future__ import annotations


def register(stages) -> None:
    from registry.config import RegistryConfig

    stages.add_section("registry", RegistryConfig)
    stages.add_commands("registry", "registry.cli:app")
    # The core asks these without importing the registry: who someone is, and what a governed alias names.
    stages.add_service("authenticate", "registry.identities:authenticate")
    stages.add_service("release_version", "registry.resolve:release_version")
    stages.add_service("verify_model_files", "registry.integrity:verify_files")
    stages.add_service("registry_present", "registry.resolve:present")
    stages.add_service("packaged_gguf", "registry.integrity:packaged_gguf")
    stages.add_service("record_package", "registry.integrity:record_package")
    stages.add_service("attest", "registry.attest_store:attest_from_env")
