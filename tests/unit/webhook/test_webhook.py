"""gpudra webhook: reviews in and out, the verdicts, the serving certificate."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from services.core.model import configs
from services.core.model import featuregates as fg
from services.local import admission
from services.webhook import admit, certs, review
from tests.helpers import badconfigs

GATES = fg.parse(badconfigs.GATES)


def request(obj: dict[str, Any] | None, **overrides: Any) -> review.AdmissionRequest:
    api_version = (obj or {}).get("apiVersion", "resource.k8s.io/v1")
    body: dict[str, Any] = {
        "uid": "u-1",
        "kind": {
            "group": "resource.k8s.io",
            "version": api_version.split("/")[-1],
            "kind": (obj or {}).get("kind", "ResourceClaim"),
        },
        "operation": "CREATE",
        "namespace": "team",
        "name": (obj or {}).get("metadata", {}).get("name", ""),
        "object": obj,
        **overrides,
    }
    raw = json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}
    )
    return review.parse(raw.encode())


def prepare_error(params: dict[str, Any]) -> str:
    """What prepare says about the same config (the allocation's config[0], FromClaim)."""
    with pytest.raises(configs.ConfigError) as err:
        configs.check_opaque(configs.DRIVER, params, "config[0] (FromClaim)", GATES)
    return str(err.value)


@pytest.mark.parametrize(
    ("name", "params", "words"), badconfigs.BAD, ids=[c[0] for c in badconfigs.BAD]
)
@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_each_bad_config_is_denied_with_prepares_words(
    name: str, params: dict[str, Any], words: str, version: str
) -> None:
    verdict = admit.admit(request(badconfigs.claim("team", f"bad-{name}", params, version)), GATES)
    assert not verdict.allowed
    assert verdict.code == 422
    assert verdict.message.startswith(
        f"ResourceClaim team/bad-{name}: 1 config failed to validate: "
    )
    assert words in verdict.message
    assert prepare_error(params) + " (requests: gpu)" in verdict.message
    assert "config[0] (FromClaim)" in verdict.message


def test_templates_are_judged_at_spec_spec() -> None:
    inner = badconfigs.claim("team", "x", badconfigs.BAD[0][1])
    template = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tmpl", "namespace": "team"},
        "spec": {"spec": inner["spec"]},
    }
    verdict = admit.admit(request(template), GATES)
    assert not verdict.allowed
    assert verdict.message.startswith("ResourceClaimTemplate team/tmpl: 1 config failed")


def test_good_configs_and_other_drivers_are_admitted() -> None:
    good = badconfigs.claim(
        "team",
        "ok",
        {"apiVersion": badconfigs.API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
    )
    assert admit.admit(request(good), GATES).allowed
    other = badconfigs.claim("team", "other", {"anything": True})
    other["spec"]["devices"]["config"][0]["opaque"]["driver"] = "example.com"
    assert admit.admit(request(other), GATES).allowed
    no_config = badconfigs.claim("team", "plain", {})
    del no_config["spec"]["devices"]["config"]
    assert admit.admit(request(no_config), GATES).allowed


def test_the_gates_decide_as_on_the_node() -> None:
    mps = badconfigs.claim(
        "team",
        "mps",
        {"apiVersion": badconfigs.API, "kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
    )
    verdict = admit.admit(request(mps), fg.parse(""))
    assert not verdict.allowed
    assert 'the "MPSSupport" feature gate is not enabled' in verdict.message


def test_every_failing_config_is_named_by_index() -> None:
    obj = badconfigs.claim("team", "two", badconfigs.BAD[0][1])
    entries = obj["spec"]["devices"]["config"]
    entries.append({"opaque": {"driver": "gpu.nvidia.com", "parameters": badconfigs.BAD[2][1]}})
    verdict = admit.admit(request(obj), GATES)
    assert "2 configs failed to validate" in verdict.message
    assert "config[0] (FromClaim) GpuConfig.sharing.strategy" in verdict.message
    assert "config[1] (FromClaim) GpuConfig.sharing.mpsConfig.defaultActiveThreadPercentage" in (
        verdict.message
    )


@pytest.mark.parametrize(
    ("params", "words"),
    [
        (
            {"apiVersion": badconfigs.API, "kind": "ComputeDomainChannelConfig"},
            "ComputeDomainChannelConfig.domainID: must not be empty",
        ),
        (
            {"apiVersion": badconfigs.API, "kind": "ComputeDomainChannelConfig", "domainID": "d",
             "allocationMode": "Some"},
            "ComputeDomainChannelConfig.allocationMode: unknown allocation mode 'Some'",
        ),
        (
            {"apiVersion": badconfigs.API, "kind": "ComputeDomainDaemonConfig", "domainID": "d",
             "extra": 1},
            "ComputeDomainDaemonConfig.extra: unknown field",
        ),
        (
            {"apiVersion": badconfigs.API, "kind": "GpuConfig"},
            "unknown kind 'GpuConfig'; expected one of ComputeDomainChannelConfig",
        ),
    ],
)  # fmt: skip
def test_compute_domain_configs_are_judged_too(params: dict[str, Any], words: str) -> None:
    obj = badconfigs.claim("team", "cd", params)
    obj["spec"]["devices"]["config"][0]["opaque"]["driver"] = configs.CD_DRIVER
    verdict = admit.admit(request(obj), GATES)
    assert not verdict.allowed
    assert words in verdict.message


def test_a_good_compute_domain_config_is_admitted() -> None:
    params = {"apiVersion": badconfigs.API, "kind": "ComputeDomainChannelConfig",
              "domainID": "5f0c", "allocationMode": "All"}  # fmt: skip
    obj = badconfigs.claim("team", "cd", params)
    obj["spec"]["devices"]["config"][0]["opaque"]["driver"] = configs.CD_DRIVER
    assert admit.admit(request(obj), GATES).allowed


def test_an_update_that_does_not_change_the_configs_is_admitted() -> None:
    """A claim admitted before the webhook must still lose its finalizers."""
    bad = badconfigs.claim("team", "old", badconfigs.BAD[0][1])
    assert admit.admit(request(bad, operation="UPDATE", oldObject=bad), GATES).allowed
    good = badconfigs.claim("team", "old", {"apiVersion": badconfigs.API, "kind": "GpuConfig"})
    assert not admit.admit(request(bad, operation="UPDATE", oldObject=good), GATES).allowed


def test_other_kinds_and_shapes_are_denied_not_guessed() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    other = request(pod, kind={"group": "", "version": "v1", "kind": "Pod"})
    verdict = admit.admit(other, GATES)
    assert not verdict.allowed and verdict.code == 400
    assert "got core/v1 Pod" in verdict.message
    broken = badconfigs.claim("team", "broken", {})
    broken["spec"]["devices"]["config"] = {"not": "a list"}
    verdict = admit.admit(request(broken), GATES)
    assert (
        not verdict.allowed and "spec.devices.config: expected a list, got dict" in verdict.message
    )
    assert not admit.admit(request(None), GATES).allowed


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "empty body"),
        (b"{not json", "body is not JSON"),
        (b"[" * 100_000, "body nested too deeply"),
        (b"[]", "not an AdmissionReview: a JSON list"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {}}',
         "unsupported review admission.k8s.io/v1beta1/AdmissionReview"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "has no request"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 5}}',
         "not an AdmissionReview request: Expected `str`, got `int` - at `$.uid`"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": '
         b'{"uid": "", "kind": {}, "operation": "CREATE"}}', "empty uid"),
    ],
)  # fmt: skip
def test_malformed_reviews_are_specific_errors(body: bytes, words: str) -> None:
    with pytest.raises(review.ReviewError, match=None) as err:
        review.parse(body)
    assert words in str(err.value)


def test_a_denial_is_an_admission_review_response() -> None:
    out = json.loads(review.response("u-9", False, "no", 422))
    assert out == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {
            "uid": "u-9",
            "allowed": False,
            "status": {"status": "Failure", "message": "no", "reason": "Invalid", "code": 422},
        },
    }


def test_an_expired_certificate_is_named_with_its_date(tmp_path: Path) -> None:
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    issued = admission.issue(tmp_path, not_before=past, not_after=past + dt.timedelta(days=1))
    with pytest.raises(certs.CertificateError) as err:
        certs.check(issued.cert, issued.key)
    assert f"serving certificate {issued.cert} expired at 2020-01-02T00:00:00+00:00" in str(
        err.value
    )


def test_not_yet_valid_mismatched_and_missing_files(tmp_path: Path) -> None:
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    early = admission.issue(tmp_path / "early", not_before=future)
    with pytest.raises(certs.CertificateError, match="is not valid before"):
        certs.check(early.cert, early.key)
    good = admission.issue(tmp_path / "good")
    with pytest.raises(certs.CertificateError, match="does not match certificate"):
        certs.check(good.cert, early.key)
    with pytest.raises(certs.CertificateError, match="No such file"):
        certs.check(tmp_path / "none.crt", good.key)
    (tmp_path / "junk.crt").write_text("junk")
    with pytest.raises(certs.CertificateError, match="not a PEM certificate"):
        certs.check(tmp_path / "junk.crt", good.key)
    assert certs.check(good.cert, good.key) > dt.datetime.now(dt.UTC)


def test_a_renewed_certificate_is_loaded_and_an_expired_renewal_refused(tmp_path: Path) -> None:
    first = admission.issue(tmp_path)
    ctx, served = certs.context(first.cert, first.key)
    assert certs.reload(ctx, first.cert, first.key, served) is served  # unchanged: no-op
    past = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    admission.issue(tmp_path, not_before=past, not_after=past + dt.timedelta(days=1))
    with pytest.raises(certs.CertificateError, match="expired"):
        certs.reload(ctx, first.cert, first.key, served)
    renewed = admission.issue(tmp_path)
    again = certs.reload(ctx, renewed.cert, renewed.key, served)
    assert again.stamp != served.stamp


def test_a_certificate_that_expires_while_serving_fails_readyz_by_name(tmp_path: Path) -> None:
    from services.webhook.server import Webhook

    issued = admission.issue(tmp_path)
    hook = Webhook(GATES, issued.cert, issued.key)
    hook.ctx, hook.served = certs.context(issued.cert, issued.key)
    hook.refresh()
    assert hook.problem == ""
    later = hook.served.not_after + dt.timedelta(seconds=1)
    hook.refresh(now=later)
    assert hook.problem.startswith(f"serving certificate {issued.cert} expired at ")
    renewed = admission.issue(tmp_path)  # cert-manager renews the files in place
    hook.refresh()
    assert hook.problem == "" and hook.served.stamp == certs.stamp(renewed.cert, renewed.key)


def deep_review(
    operation: str = "CREATE", old_params: str = "", kind: str = "ResourceClaim"
) -> bytes:
    """A review of a claim whose second config is nested 4,000 deep (the API server stores
    it); ``old_params``: the JSON of that config's parameters in the old object, if any."""

    def claim(params: str) -> dict[str, Any]:
        obj = badconfigs.claim("team", "deep", {"apiVersion": badconfigs.API, "kind": "GpuConfig"})
        good = obj["spec"]["devices"]["config"][0]
        deep = {**good, "opaque": {"driver": "gpu.nvidia.com", "parameters": params}}
        obj["spec"]["devices"]["config"] = [good, deep]
        return obj

    body = {"uid": "u-1", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "operation": operation, "namespace": "team", "name": "deep", "object": claim("DEEP"),
            **({"oldObject": claim("OLD")} if old_params else {})}  # fmt: skip
    text = json.dumps({"apiVersion": review.API_VERSION, "kind": review.KIND, "request": body})
    text = text.replace('"OLD"', old_params)  # json.dumps of a deep value would recurse
    return text.replace('"DEEP"', "[" * 4000 + "]" * 4000).encode()


def test_a_claim_too_deep_to_read_is_denied_by_its_uid_naming_the_config() -> None:
    """An HTTP 400 reached the user as "rejected for an unknown reason" (the API server
    shows only an AdmissionReview's message); now the denial says which config."""
    body = deep_review()
    with pytest.raises(review.TooDeep) as err:
        review.parse(body)
    assert err.value.request.uid == "u-1"
    verdict = admit.too_deep(err.value.request, body)
    assert verdict == admit.Verdict(
        False,
        "ResourceClaim team/deep: config[1] (FromClaim): nested too deeply to read "
        "(more than about 1,000 levels)",
        422,
    )


def test_an_update_leaving_deep_configs_as_they_were_is_admitted() -> None:
    """As for any claim admitted before the webhook: its finalizers must come off."""
    deep = "[" * 4000 + "]" * 4000
    same = deep_review("UPDATE", old_params=deep)
    with pytest.raises(review.TooDeep) as err:
        review.parse(same)
    assert admit.too_deep(err.value.request, same).allowed
    changed = deep_review("UPDATE", old_params="{}")
    with pytest.raises(review.TooDeep) as err:
        review.parse(changed)
    assert not admit.too_deep(err.value.request, changed).allowed
    pod = deep_review(kind="Pod")
    with pytest.raises(review.TooDeep) as err:
        review.parse(pod)
    assert admit.too_deep(err.value.request, pod).code == 400


def test_a_pinned_limit_no_device_can_have_is_denied_at_admission() -> None:
    """It was admitted and prepared: a 36-digit MiB figure in the checkpoint."""
    huge = {"defaultPinnedDeviceMemoryLimit": "99999999999999999999999Ei"}
    params = {"apiVersion": badconfigs.API, "kind": "GpuConfig",
              "sharing": {"strategy": "MPS", "mpsConfig": huge}}  # fmt: skip
    verdict = admit.admit(request(badconfigs.claim("team", "huge", params)), GATES)
    assert not verdict.allowed and verdict.code == 422
    assert (
        "config[0] (FromClaim) GpuConfig.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
        "99999999999999999999999Ei is more memory than any device has"
    ) in verdict.message
