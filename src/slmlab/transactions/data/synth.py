"""A seeded synthetic card bank: world, merchants, customer archetypes, legitimate behaviour with
confounders, and four labelled fraud patterns (docs/transactions.md, "Synthetic bank").

Determinism: ``np.random.SeedSequence(seed)`` spawns four streams (world, merchants, fraud campaigns,
customers); customer ``i`` draws from its own child ``(customers, i)``, so the output is identical for
any chunking. Each customer is generated with array operations (all days' counts, then all fields).
Card-testing campaigns are drawn once at campaign level and merged into their victims' histories.
The behaviour's probabilities and ranges are the fields of :class:`BehaviourConfig`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import yaml

from .._deps import pd

SYNTH_YAML = Path(__file__).parents[1] / "configs" / "synth.yaml"
PATTERNS = ("card_testing", "account_takeover", "counterfeit_after_compromise", "lost_stolen")
CASE_SIZE = {"card_testing": 12.0, "account_takeover": 4.0, "counterfeit_after_compromise": 5.0, "lost_stolen": 8.0}

# mcc, kind, base weight, median $, log-sigma, online share, hour peaks, recurring
MCC_TABLE = [
    (5411, "grocery", 10, 45, .6, .05, (10, 18), False), (5812, "restaurant", 6, 28, .5, 0, (12, 19), False),
    (5814, "fast food", 7, 11, .4, .1, (8, 12, 18), False), (5541, "fuel", 5, 40, .35, 0, (7, 17), False),
    (5912, "drugstore", 3, 18, .7, .1, (11, 17), False), (5311, "department", 2, 60, .8, .2, (14, 17), False),
    (5691, "clothing", 2, 55, .7, .4, (14, 19), False), (5732, "electronics", .6, 160, .9, .5, (14, 20), False),
    (5944, "jewelry", .1, 250, 1.0, .3, (14,), False), (5999, "misc retail", 2, 30, .9, .3, (13,), False),
    (4111, "transit", 3, 3, .3, .1, (8, 18), False), (4121, "taxi/ride", 1.5, 18, .5, .3, (9, 23), False),
    (4511, "airline", .2, 320, .6, .9, (10, 20), False), (7011, "hotel", .2, 180, .6, .6, (16,), False),
    (4814, "telecom", .3, 65, .2, .9, (9,), True), (4900, "utilities", .3, 120, .4, .9, (9,), True),
    (4899, "streaming", .3, 15, .2, 1, (3,), True), (5815, "digital media", 1, 10, .5, 1, (20,), False),
    (5818, "digital goods", .5, 8, .8, 1, (21,), False), (5968, "subscription", .3, 20, .4, 1, (4,), True),
    (5921, "liquor", .7, 25, .5, .1, (18,), False), (7832, "cinema", .4, 24, .3, .3, (19,), False),
    (7997, "gym", .3, 45, .3, .5, (6, 18), True), (8011, "doctors", .3, 90, .7, .1, (10,), False),
    (6011, "ATM cash", 1, 100, .6, 0, (12,), False), (4829, "money transfer", .2, 200, .9, .8, (12,), False),
    (6540, "stored value", .2, 50, .5, .7, (13,), False), (8398, "charity", .1, 25, .8, .9, (20,), False),
]
MCC = np.array([r[0] for r in MCC_TABLE])
MCC_W = np.array([r[2] for r in MCC_TABLE], float)
MCC_MED = np.array([r[3] for r in MCC_TABLE], float)
MCC_SIG = np.array([r[4] for r in MCC_TABLE], float)
MCC_ONLINE = np.array([r[5] for r in MCC_TABLE], float)
MCC_RECUR = np.array([r[7] for r in MCC_TABLE])
MI = {m: i for i, m in enumerate(MCC)}

# name: txns/day, amount x, online x, night propensity, trips/year, MCC boosts
ARCHETYPES = {
    "student": (1.6, 0.6, 1.5, .3, 1, {5814: 2, 5815: 2, 5818: 2}),
    "young_professional": (2.4, 1.0, 1.3, .15, 2, {5812: 1.5}),
    "family": (2.8, 1.2, .8, .05, 1.5, {5411: 1.8}),
    "retiree": (1.3, .9, .4, .02, 1.5, {8011: 2, 5912: 1.5}),
    "business_traveler": (2.6, 1.6, 1.0, .1, 8, {4511: 4, 7011: 4, 4121: 2}),
    "night_shift": (2.0, .9, 1.0, .6, 1, {}),
    "affluent": (2.2, 2.5, 1.1, .1, 5, {5944: 3, 5691: 1.5}),
}
ARCH_NAMES = list(ARCHETYPES)
WEEKDAY_FACTOR = np.array([1, 1, 1, 1, 1.15, 1.3, 0.9])
FOREIGN = [("CA", "CAD", 50, -100), ("MX", "MXN", 23, -102), ("GB", "GBP", 53, -1), ("FR", "EUR", 46, 2),
           ("DE", "EUR", 51, 10), ("ES", "EUR", 40, -4), ("IT", "EUR", 42, 12), ("NL", "EUR", 52, 5),
           ("JP", "JPY", 36, 138), ("CN", "CNY", 35, 105), ("IN", "INR", 21, 78), ("BR", "BRL", -10, -52),
           ("AU", "AUD", -25, 134), ("ZA", "ZAR", -30, 25), ("TH", "THB", 15, 101), ("AE", "AED", 24, 54),
           ("TR", "TRY", 39, 35), ("RU", "RUB", 56, 38), ("NG", "NGN", 9, 8), ("KR", "KRW", 36, 128),
           ("SG", "SGD", 1, 104)]
CT_MCCS, ATO_MCCS = (5818, 8398, 5968, 5814, 5999, 5815), (5732, 6540, 5944, 4829)
CF_MCCS, LS_MCCS = (6011, 5411, 5311, 5541, 5812), (5411, 5921, 5541, 5814, 5999)
REFUND_MCCS = (5311, 5691, 5732, 5999, 5944, 5411)
KM_PER_DEG = 111.0


@dataclass(frozen=True)
class BehaviourConfig:
    """How customers, merchants and fraudsters behave: the generator's probabilities, counts and
    ranges (a field of :class:`SynthConfig`; the defaults produce the documented bank).

    Conventions: a ``*_share`` or ``*_rate`` is a probability per transaction (or per case / merchant,
    as its comment says); an integer range ``(lo, hi)`` is numpy's half-open ``integers(lo, hi)``, so
    ``(3, 21)`` means 3 to 20; a float range is ``uniform(lo, hi)``; a ``*_mix`` gives the
    probabilities of the listed codes. Shares marked "x difficulty" are multiplied by
    :attr:`SynthConfig.difficulty` (0: the easy bank without confounders); an ``*_easy`` field
    replaces its pattern's range when the difficulty is 0.
    """

    # -- merchants ----------------------------------------------------------------------------------
    merchant_abroad_share: float = 0.15  # physical merchants located in a foreign city
    online_foreign_share: float = 0.15  # online merchants based abroad
    legacy_terminal_share: float = 0.03  # physical merchants whose terminal only swipes
    merchant_price_sigma: float = 0.25  # log-sigma of a merchant's price level (lognormal around 1)
    compromise_days: tuple[int, int] = (7, 22)  # how long a compromised fuel/ATM terminal skims, in days

    # -- customers: profile ---------------------------------------------------------------------------
    rate_shape: float = 4.0  # Gamma shape of the customer's rate multiplier (scale 1 / shape: mean 1)
    amount_mult_sigma: float = 0.3  # log-sigma of the customer's amount multiplier
    mcc_concentration: float = 30.0  # Dirichlet concentration of the customer's MCC mix around the archetype's
    devices: tuple[int, int] = (1, 4)  # online devices a customer owns

    # -- customers: legitimate behaviour --------------------------------------------------------------
    payday_boost: float = 1.2  # spending factor on days 1, 2, 15 and 16 of the month
    trip_days: tuple[int, int] = (2, 11)  # length of a trip
    trip_abroad_share: float = 0.3  # trips that go abroad (else to another home city)
    online_favourites: tuple[int, int] = (1, 4)  # favourite online merchants per MCC
    online_favourite_share: float = 0.8  # online purchases at a favourite
    home_favourites: tuple[int, int] = (2, 7)  # favourite home-city merchants per MCC
    home_favourite_share: float = 0.85  # home-city card-present purchases at a favourite
    foreign_online_share: float = 0.08  # online purchases at a foreign merchant (x difficulty)
    big_purchase_share: float = 0.01  # purchases far above the usual amount (x difficulty) ...
    big_purchase_factor: tuple[float, float] = (3.0, 10.0)  # ... by this factor
    entry_mix: tuple[float, ...] = (0.55, 0.35, 0.08, 0.02)  # card-present entry: chip, contactless, swipe, manual_key
    chip_pin_share: float = 0.5  # chip purchases verified by PIN (else signature)
    cvm_limit: float = 100.0  # contactless purchases below this amount need no verification (no_cvm)
    online_auth_mix: tuple[float, ...] = (0.6, 0.1, 0.3)  # online auth: 3ds_frictionless, 3ds_challenge, none
    device_churn: float = 1 / 60  # online purchases after which a new device id appears
    insufficient_funds_rate: float = 0.002  # per transaction, x amount / the customer's median amount ...
    insufficient_funds_cap: float = 0.2  # ... capped at this probability
    bad_pin_rate: float = 0.003  # PIN transactions declined bad_pin
    bad_cvv_rate: float = 0.002  # online transactions declined bad_cvv
    technical_error_rate: float = 0.001  # transactions declined technical_error
    verification_share: float = 0.04  # $0 verifications before a non-favourite online purchase (x difficulty)
    refund_share: float = 0.005  # retail purchases refunded ...
    refund_days: tuple[int, int] = (1, 15)  # ... this many days later
    subscriptions: tuple[int, int] = (2, 6)  # monthly subscriptions tried per customer

    # -- card testing: a fraud device tries small charges at 1-2 online merchants on many cards ----------
    ct_victims: tuple[int, int] = (5, 41)  # cards per campaign
    ct_merchants: tuple[int, int] = (1, 3)  # merchants per campaign
    ct_attempts: tuple[int, int] = (3, 21)  # attempts per card ...
    ct_start_s: int = 7200  # ... starting within this many seconds of the campaign ...
    ct_gap_s: tuple[int, int] = (5, 600)  # ... this many seconds apart
    ct_zero_share: float = 0.5  # attempts that are $0 card verifications (else small charges)
    ct_amount: tuple[float, float] = (0.5, 12.0)  # small charge amounts
    ct_amount_easy: tuple[float, float] = (0.5, 2.0)
    ct_decline_share: float = 0.4  # attempts declined ...
    ct_decline_mix: tuple[float, ...] = (0.5, 0.25, 0.25)  # ... as bad_cvv, bad_expiry, do_not_honor
    ct_cashout_share: float = 0.6  # cards with an approved attempt that are then cashed out ...
    ct_cashouts: tuple[int, int] = (1, 4)  # ... in this many purchases ...
    ct_cashout_delay_s: tuple[int, int] = (600, 86400)  # ... starting this long after the last attempt ...
    ct_cashout_gap_s: tuple[int, int] = (60, 3600)  # ... this many seconds apart ...
    ct_cashout_amount: tuple[float, float] = (200.0, 1500.0)  # ... of this amount

    # -- account takeover: online purchases from a new device ----------------------------------------
    ato_purchases: tuple[int, int] = (2, 7)  # purchases per case ...
    ato_hours: tuple[float, float] = (1.0, 48.0)  # ... spread over up to this many hours
    ato_mimic_share: float = 0.5  # cases in MCCs the customer already buys online (x difficulty)
    ato_foreign_share: float = 0.5  # purchases of a non-mimicking case at foreign merchants (difficulty 0: all)
    ato_amount_factor: tuple[float, float] = (1.5, 6.0)  # amount / the customer's median amount
    ato_verification_share: float = 0.5  # cases opened by a $0 verification 30 s before

    # -- counterfeit after a compromise: a swipe spree far from home ------------------------------------
    cf_purchases: tuple[int, int] = (2, 9)  # purchases per case ...
    cf_delay_days: tuple[int, int] = (3, 31)  # ... starting this many days after the skimming ...
    cf_spread_days: tuple[float, float] = (1.0, 3.0)  # ... spread over up to this many days ...
    cf_far_km: float = 300.0  # ... in a home city at least this far away ...
    cf_abroad_share: float = 0.5  # ... or, for this share of the cases, abroad
    cf_amount_factor: tuple[float, float] = (1.0, 4.0)  # amount / the MCC's median amount
    cf_amount_factor_easy: tuple[float, float] = (4.0, 8.0)
    cf_atm_bad_pin_share: float = 0.3  # ATM withdrawals of the spree declined bad_pin
    cf_exposure_sigma: float = 0.3  # log-sigma of the skimmed (legitimate) transaction's amount

    # -- lost or stolen card: a contactless spree just under the no-CVM limit, then a new card ----------
    ls_purchases: tuple[int, int] = (4, 13)  # purchases per case ...
    ls_hours: tuple[float, float] = (1.0, 6.0)  # ... spread over up to this many hours ...
    ls_amount: tuple[float, float] = (60.0, 99.9)  # ... of this amount
    ls_amount_easy: tuple[float, float] = (95.0, 99.9)
    ls_new_card_days: tuple[float, float] = (1.0, 3.0)  # the customer's silence before the new card

    # -- labels ------------------------------------------------------------------------------------
    label_delay_median_days: float = 10.0  # lognormal delay from a case's end to its label ...
    label_delay_sigma: float = 0.6  # ... with this log-sigma ...
    label_delay_days: tuple[float, float] = (1.0, 60.0)  # ... clipped to this range

    @classmethod
    def from_dict(cls, values: dict) -> BehaviourConfig:
        """From a mapping (YAML, a manifest): lists become tuples; an unknown key raises ``TypeError``."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})

    def validate(self) -> BehaviourConfig:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name.endswith(("_share", "_rate", "_cap", "device_churn")) and not 0.0 <= v <= 1.0:
                raise ValueError(f"behaviour.{f.name} is a probability in [0, 1], got {v!r}")
            if f.name.endswith("_mix") and (min(v) < 0 or abs(sum(v) - 1) > 1e-6):
                raise ValueError(f"behaviour.{f.name} must be probabilities summing to 1, got {v!r}")
            if isinstance(v, tuple) and not f.name.endswith("_mix") and not v[0] <= v[1]:
                raise ValueError(f"behaviour.{f.name} must be a range (lo, hi) with lo <= hi, got {v!r}")
        return self


DEFAULT_BEHAVIOUR = BehaviourConfig()


@dataclass
class SynthConfig:
    """Generator settings (``configs/synth.yaml``; presets ``tiny``, ``small``, ``default``, ``large``); how
    customers and fraudsters behave is :attr:`behaviour` (a :class:`BehaviourConfig`, or a mapping of
    its fields to override)."""

    seed: int = 1234
    n_customers: int = 5000
    n_days: int = 180
    start: str = "2024-01-01"
    n_physical_merchants: int = 12000
    n_online_merchants: int = 2000
    n_home_cities: int = 40
    n_foreign_countries: int = 19
    target_fraud_rate: float = 0.003
    pattern_mix: dict = field(default_factory=lambda: {"card_testing": 0.30, "account_takeover": 0.25,
                                                       "counterfeit_after_compromise": 0.25, "lost_stolen": 0.20})
    difficulty: float = 1.0
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)

    def __post_init__(self) -> None:
        if isinstance(self.behaviour, dict):
            self.behaviour = BehaviourConfig.from_dict(self.behaviour)

    def to_dict(self) -> dict:
        """The settings as plain values (``behaviour`` only when it differs from the defaults, so the
        manifest of a default bank is unchanged)."""
        out = asdict(self)
        if self.behaviour == DEFAULT_BEHAVIOUR:
            del out["behaviour"]
        return out

    @classmethod
    def from_preset(cls, name: str = "default", **overrides) -> SynthConfig:
        table = yaml.safe_load(SYNTH_YAML.read_text())
        if name not in table:
            raise ValueError(f"unknown synth preset {name!r}; presets: {sorted(table)}")
        values = {**table["default"], **(table[name] if name != "default" else {}), **overrides}
        return cls(**values).validate()

    def validate(self) -> SynthConfig:
        for key in ("n_customers", "n_days", "n_physical_merchants", "n_online_merchants", "n_home_cities"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"{key} must be a positive integer, got {getattr(self, key)!r}")
        if not 0 < self.n_foreign_countries <= len(FOREIGN):
            raise ValueError(f"n_foreign_countries must be in [1, {len(FOREIGN)}], got {self.n_foreign_countries}")
        if not 0.001 <= self.target_fraud_rate <= 0.01:
            raise ValueError(f"target_fraud_rate must be in [0.001, 0.01], got {self.target_fraud_rate}")
        if set(self.pattern_mix) - set(PATTERNS) or abs(sum(self.pattern_mix.values()) - 1) > 1e-6:
            raise ValueError(f"pattern_mix must give shares of {PATTERNS} summing to 1, got {self.pattern_mix}")
        if not 0.0 <= self.difficulty <= 1.0:
            raise ValueError(f"difficulty must be in [0, 1], got {self.difficulty}")
        self.behaviour.validate()
        return self


@dataclass
class SynthData:
    transactions: pd.DataFrame
    customers: pd.DataFrame
    merchants: pd.DataFrame
    fraud_cases: pd.DataFrame


# -- world and merchants --------------------------------------------------------------------------
@dataclass
class World:
    city_lat: np.ndarray
    city_lon: np.ndarray
    city_country: np.ndarray  # "US" or ISO code
    city_currency: np.ndarray
    city_tz: np.ndarray  # minutes
    city_pop: np.ndarray  # home cities only (foreign: 0)
    n_home: int
    m_mcc: np.ndarray  # merchant -> mcc index
    m_city: np.ndarray  # -1 for online
    m_lat: np.ndarray
    m_lon: np.ndarray
    m_online: np.ndarray
    m_legacy: np.ndarray
    m_price: np.ndarray
    m_country: np.ndarray
    m_currency: np.ndarray
    phys: dict  # (city, mcc idx) -> merchant indices
    phys_mcc: dict  # mcc idx -> physical merchant indices
    online: dict  # mcc idx -> home-country online merchants
    online_foreign: np.ndarray
    hour_base: np.ndarray  # [n_mcc, 24]
    compromised: np.ndarray  # [n, 3]: merchant, start day, end day
    any_physical: np.ndarray


def build_world(cfg: SynthConfig, rng_world: np.random.Generator, rng_merch: np.random.Generator) -> World:
    bh = cfg.behaviour
    nh = cfg.n_home_cities
    foreign = FOREIGN[: cfg.n_foreign_countries]
    lat = list(rng_world.uniform(30, 47, nh))
    lon = list(rng_world.uniform(-122, -72, nh))
    country, cur = ["US"] * nh, ["USD"] * nh
    for iso, c, la, lo in foreign:
        for _ in range(3):
            lat.append(la + rng_world.uniform(-3, 3))
            lon.append(lo + rng_world.uniform(-3, 3))
            country.append(iso)
            cur.append(c)
    lat, lon = np.array(lat), np.array(lon)
    tz = (np.round(lon / 15) * 60).astype(np.int64)
    pop = np.zeros(len(lat))
    pop[:nh] = 1.0 / np.arange(1, nh + 1)
    pop /= pop.sum()
    n_city = len(lat)
    # physical merchants
    n_p, n_o = cfg.n_physical_merchants, cfg.n_online_merchants
    w_phys = MCC_W * (1 - MCC_ONLINE) * ~MCC_RECUR
    mcc_p = rng_merch.choice(len(MCC), n_p, p=w_phys / w_phys.sum())
    home_city = rng_merch.choice(nh, n_p, p=pop[:nh])
    abroad = rng_merch.random(n_p) < bh.merchant_abroad_share
    city_p = np.where(abroad, rng_merch.integers(nh, n_city, n_p), home_city)
    lat_p = lat[city_p] + rng_merch.normal(0, 15 / KM_PER_DEG, n_p)
    lon_p = lon[city_p] + rng_merch.normal(0, 15 / KM_PER_DEG, n_p) / np.cos(np.radians(lat[city_p]))
    w_onl = MCC_W * MCC_ONLINE
    mcc_o = rng_merch.choice(len(MCC), n_o, p=w_onl / w_onl.sum())
    foreign_o = rng_merch.random(n_o) < bh.online_foreign_share
    city_o_country = np.where(foreign_o, rng_merch.integers(nh, n_city, n_o), 0)
    m_mcc = np.concatenate([mcc_p, mcc_o])
    m_city = np.concatenate([city_p, np.full(n_o, -1)])
    m_country = np.array(country)[np.concatenate([city_p, city_o_country])]
    m_currency = np.array(cur)[np.concatenate([city_p, city_o_country])]
    m_online = np.concatenate([np.zeros(n_p, bool), np.ones(n_o, bool)])
    m_legacy = np.concatenate([rng_merch.random(n_p) < bh.legacy_terminal_share, np.zeros(n_o, bool)])
    m_price = rng_merch.lognormal(0, bh.merchant_price_sigma, n_p + n_o)
    phys: dict = {}
    for i, (c, m) in enumerate(zip(city_p, mcc_p)):
        phys.setdefault((int(c), int(m)), []).append(i)
    phys = {k: np.array(v) for k, v in phys.items()}
    phys_mcc = {m: np.flatnonzero(mcc_p == m) for m in range(len(MCC))}
    online = {m: n_p + np.flatnonzero((mcc_o == m) & ~foreign_o) for m in range(len(MCC))}
    online_foreign = n_p + np.flatnonzero(foreign_o)
    hours = np.arange(24)
    hour_base = np.zeros((len(MCC), 24))
    for k, row in enumerate(MCC_TABLE):
        for peak in row[6]:
            d = np.minimum(np.abs(hours - peak), 24 - np.abs(hours - peak))
            hour_base[k] += np.exp(-0.5 * (d / 2.0) ** 2)
    # compromised fuel/ATM merchants, each for a window of behaviour.compromise_days
    cand = np.flatnonzero(np.isin(mcc_p, [MI[5541], MI[6011]]) & (city_p < nh))
    n_comp = max(2, n_p // 1500) * max(1, cfg.n_days // 30)
    chosen = rng_merch.choice(cand, min(n_comp, len(cand)), replace=False) if len(cand) else np.zeros(0, int)
    starts = rng_merch.integers(0, max(1, cfg.n_days - (bh.compromise_days[1] - 1)), len(chosen))
    compromised = np.stack([chosen, starts, starts + rng_merch.integers(*bh.compromise_days, len(chosen))], 1)
    return World(lat, lon, np.array(country), np.array(cur), tz, pop, nh, m_mcc, m_city,
                 np.concatenate([lat_p, np.full(n_o, np.nan)]), np.concatenate([lon_p, np.full(n_o, np.nan)]),
                 m_online, m_legacy, m_price, m_country, m_currency, phys, phys_mcc, online, online_foreign,
                 hour_base, compromised, np.arange(n_p))


# -- one customer's history ------------------------------------------------------------------------
COLS = ("t", "merchant", "amount", "txn_type", "entry", "auth", "device", "response", "fraud", "case", "card", "tz")
TXN_TYPES = ("purchase", "refund", "cash_withdrawal", "card_verification", "transfer")
ENTRY = ("chip", "contactless", "swipe", "manual_key", "ecommerce", "recurring")
AUTH = ("pin", "signature", "no_cvm", "3ds_frictionless", "3ds_challenge", "none")
RESP = ("approved", "insufficient_funds", "bad_pin", "bad_cvv", "bad_expiry", "do_not_honor", "invalid_card",
        "technical_error")


def txn_block(n: int, **cols) -> dict:
    """``n`` transactions as generator columns (:data:`COLS`), ``cols`` broadcast over them."""
    out = {c: np.zeros(n, np.int64) for c in COLS}
    out["amount"] = np.zeros(n, float)
    out["device"] = np.full(n, -1, np.int64)
    out["case"] = np.full(n, -1, np.int64)
    for k, v in cols.items():
        out[k] = np.broadcast_to(np.asarray(v, dtype=out[k].dtype), n).copy()
    return out


def _concat(blocks: list[dict]) -> dict:
    return {c: np.concatenate([b[c] for b in blocks]) for c in COLS}


def _pick(rng, pool: np.ndarray, n: int) -> np.ndarray:
    return pool[rng.integers(0, len(pool), n)]


def day_factors(behaviour: BehaviourConfig, start_weekday: int, start_dom: np.ndarray) -> np.ndarray:
    """Each day's spending factor (weekday x payday), for days starting on weekday ``start_weekday``
    (Monday = 0) whose days of the month are ``start_dom``: a customer's expected legitimate count on
    day ``d`` is its rate times ``factor[d]``."""
    days = np.arange(len(start_dom))
    payday = np.where(np.isin(start_dom, (1, 2, 15, 16)), behaviour.payday_boost, 1.0)
    return WEEKDAY_FACTOR[(start_weekday + days) % 7] * payday


class _Customer:
    """Profile + generator of one customer (all draws from its own stream)."""

    def __init__(self, idx: int, cfg: SynthConfig, world: World, rng: np.random.Generator) -> None:
        self.idx, self.cfg, self.w, self.rng = idx, cfg, world, rng
        self.arch = ARCH_NAMES[rng.integers(len(ARCH_NAMES))]
        rate, amt, onl, night, trips, boosts = ARCHETYPES[self.arch]
        self.home = int(rng.choice(world.n_home, p=world.city_pop[: world.n_home]))
        self.home_lat = world.city_lat[self.home] + rng.normal(0, 5 / KM_PER_DEG)
        self.home_lon = world.city_lon[self.home] + rng.normal(0, 5 / KM_PER_DEG)
        bh = cfg.behaviour
        self.rate = rate * rng.gamma(bh.rate_shape, 1 / bh.rate_shape)
        self.amount_mult = amt * rng.lognormal(0, bh.amount_mult_sigma)
        self.online_factor, self.night, self.trips = onl, night, trips
        base = MCC_W * ~MCC_RECUR
        for m, b in boosts.items():
            base[MI[m]] *= b
        self.mcc_w = rng.dirichlet(bh.mcc_concentration * base / base.sum() + 1e-9 * ~MCC_RECUR) * ~MCC_RECUR
        self.mcc_w /= self.mcc_w.sum()
        self.n_devices = int(rng.integers(*bh.devices))
        self.income_band = ["low", "mid", "high"][min(2, int(self.amount_mult > 1) + int(self.amount_mult > 2))]

    # legit behaviour
    def legit(self, start_weekday: int, start_dom: np.ndarray) -> dict:
        cfg, w, rng = self.cfg, self.w, self.rng
        bh = cfg.behaviour
        nd = cfg.n_days
        days = np.arange(nd)
        factor = day_factors(bh, start_weekday, start_dom)
        self.expected = float(self.rate * factor.sum())
        counts = rng.poisson(self.rate * factor)
        city_of_day = np.full(nd, self.home)
        for _ in range(rng.poisson(self.trips / 365 * nd)):
            s, length = int(rng.integers(nd)), int(rng.integers(*bh.trip_days))
            abroad = rng.random() < bh.trip_abroad_share
            dest = int(rng.integers(w.n_home, len(w.city_lat))) if abroad else int(rng.integers(w.n_home))
            city_of_day[s:s + length] = dest
        day = np.repeat(days, counts)
        n = len(day)
        mcc = rng.choice(len(MCC), n, p=self.mcc_w)
        prof = w.hour_base + self.night * np.r_[np.ones(6), np.zeros(16), np.ones(2)] + 0.01
        cdf = np.cumsum(prof / prof.sum(1, keepdims=True), 1)
        hour = np.minimum((rng.random(n)[:, None] > cdf[mcc]).sum(1), 23)
        local = day * 86400 + hour * 3600 + rng.integers(0, 3600, n)
        online = rng.random(n) < np.clip(MCC_ONLINE[mcc] * self.online_factor, 0, 1)
        city = city_of_day[day]
        merchant = np.zeros(n, np.int64)
        favourite = np.zeros(n, bool)
        for m in np.unique(mcc):
            pool_o = w.online.get(int(m), np.zeros(0, int))
            if len(w.phys_mcc[int(m)]) == 0 and len(pool_o):
                online |= mcc == m  # no physical merchant sells this
            sel_o = (mcc == m) & online
            if len(pool_o) == 0:
                online &= ~(mcc == m)
                sel_o[:] = False
            else:
                fav = _pick(rng, pool_o, int(rng.integers(*bh.online_favourites)))
                use = rng.random(sel_o.sum()) < bh.online_favourite_share
                merchant[sel_o] = np.where(use, _pick(rng, fav, sel_o.sum()), _pick(rng, pool_o, sel_o.sum()))
                favourite[sel_o] = use
            sel_p = (mcc == m) & ~online
            if not sel_p.any():
                continue
            home_pool = w.phys.get((self.home, int(m)), w.phys_mcc[int(m)])
            if not len(home_pool):
                home_pool = w.any_physical
            fav = _pick(rng, home_pool, int(rng.integers(*bh.home_favourites)))
            for c in np.unique(city[sel_p]):
                sel = sel_p & (city == c)
                k = int(sel.sum())
                if c == self.home:
                    use = rng.random(k) < bh.home_favourite_share
                    merchant[sel] = np.where(use, _pick(rng, fav, k), _pick(rng, home_pool, k))
                else:
                    pool = w.phys.get((int(c), int(m)))
                    pool = pool if pool is not None else home_pool
                    merchant[sel] = _pick(rng, pool, k)
        d = self.cfg.difficulty
        foreign_onl = online & (rng.random(n) < bh.foreign_online_share * d) & (len(w.online_foreign) > 0)
        if foreign_onl.any():
            merchant[foreign_onl] = _pick(rng, w.online_foreign, int(foreign_onl.sum()))
        mi = w.m_mcc[merchant]
        amount = np.round(rng.lognormal(np.log(MCC_MED[mi] * self.amount_mult * w.m_price[merchant]), MCC_SIG[mi]), 2)
        big = rng.random(n) < bh.big_purchase_share * d
        amount[big] = np.round(amount[big] * rng.uniform(*bh.big_purchase_factor, big.sum()), 2)
        entry = rng.choice(4, n, p=list(bh.entry_mix))
        entry[w.m_legacy[merchant]] = 2
        entry[online] = 4
        pin = (mi == MI[6011]) | ((entry == 0) & (rng.random(n) < bh.chip_pin_share))
        auth = np.where(pin, 0, np.where((entry == 1) & (amount < bh.cvm_limit), 2, 1))
        auth[online] = rng.choice([3, 4, 5], online.sum(), p=list(bh.online_auth_mix))
        ttype = np.where(mi == MI[6011], 2, np.where(mi == MI[4829], 4, 0))
        churn = np.cumsum(online & (rng.random(n) < bh.device_churn))
        device = np.where(online, (rng.integers(0, self.n_devices, n) + churn), -1)
        med = np.median(amount) if n else 1.0
        u = rng.random(n)
        resp = np.zeros(n, np.int64)
        resp[u < np.clip(bh.insufficient_funds_rate * amount / med, 0, bh.insufficient_funds_cap)] = 1
        resp[(auth == 0) & (rng.random(n) < bh.bad_pin_rate)] = 2
        resp[online & (rng.random(n) < bh.bad_cvv_rate)] = 3
        resp[rng.random(n) < bh.technical_error_rate] = 7
        tz = np.where(online, w.city_tz[self.home], w.city_tz[np.maximum(w.m_city[merchant], 0)])
        blocks = [dict(zip(COLS, (local - tz * 60, merchant, amount, ttype, entry, auth, device, resp,
                                  np.zeros(n, np.int64), np.full(n, -1), np.zeros(n, np.int64), tz)))]
        # legit $0 verifications before some online purchases at non-favourite merchants
        ver = online & ~favourite & (rng.random(n) < bh.verification_share * d)
        if ver.any():
            v_block = {c: v[ver].copy() for c, v in blocks[0].items()}
            v_block["t"] -= rng.integers(1, 60, ver.sum())
            v_block["amount"][:] = 0.0
            v_block["txn_type"][:] = 3
            v_block["response"][:] = 0
            blocks.append(v_block)
        # refunds of retail purchases, 1-14 days later
        ref = np.isin(MCC[mi], REFUND_MCCS) & (rng.random(n) < bh.refund_share)
        if ref.any():
            r_block = {c: v[ref].copy() for c, v in blocks[0].items()}
            r_block["t"] += rng.integers(*bh.refund_days, ref.sum()) * 86400
            r_block["amount"] = -r_block["amount"]
            r_block["txn_type"][:] = 1
            r_block["response"][:] = 0
            blocks.append(r_block)
        # subscriptions: fixed amount and day of month, entry mode `recurring`
        for _ in range(int(rng.integers(*bh.subscriptions))):
            m = int(rng.choice(np.flatnonzero(MCC_RECUR)))
            pool = w.online.get(m, np.zeros(0, int))
            if not len(pool):
                continue
            merch, dom = int(_pick(rng, pool, 1)[0]), int(rng.integers(1, 29))
            sub_days = days[start_dom == dom]
            k = len(sub_days)
            amt = round(float(rng.lognormal(np.log(MCC_MED[m]), MCC_SIG[m])), 2)
            tz0 = int(w.city_tz[self.home])
            blocks.append(txn_block(k, t=sub_days * 86400 + rng.integers(3, 9, k) * 3600 - tz0 * 60, merchant=merch,
                                 amount=amt, entry=5, auth=5, tz=tz0))
        return _concat(blocks)


def account_takeover_block(rng: np.random.Generator, w: World, mcc_w: np.ndarray, amounts: np.ndarray,
                           difficulty: float, tz: int, device: int, start_range: tuple[int, int],
                           behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """An account-takeover case (defaults of ``behaviour``): 2-6 online purchases within 1-48 h from a
    new ``device``, starting at a time drawn from ``start_range`` (seconds from the bank's start,
    ``[lo, hi)``); w.p. ``0.5 * difficulty`` in MCCs the customer already buys online (``mcc_w``: the
    customer's MCC weights), else in electronics / stored value / jewellery / money transfer, half of
    them at foreign merchants; amounts = the median of the customer's positive ``amounts`` x
    U(1.5, 6); w.p. 0.5 a $0 verification 30 s before. Returns a block of transaction columns."""
    bh = behaviour
    k = int(rng.integers(*bh.ato_purchases))
    t = int(rng.integers(*start_range)) + np.sort(rng.uniform(0, rng.uniform(*bh.ato_hours) * 3600, k)).astype(np.int64)
    mimic = rng.random() < bh.ato_mimic_share * difficulty
    if mimic:
        own = np.flatnonzero((mcc_w > 0) & (MCC_ONLINE > 0.2))
        mccs = rng.choice(own, k) if len(own) else rng.choice([MI[m] for m in ATO_MCCS], k)
        merch = np.array([_pick(rng, w.online.get(int(m), w.online_foreign), 1)[0]
                          if len(w.online.get(int(m), [])) else _pick(rng, w.online_foreign, 1)[0] for m in mccs])
    else:
        mccs = rng.choice([MI[m] for m in ATO_MCCS], k)
        foreign = rng.random(k) < (bh.ato_foreign_share if difficulty > 0 else 1.0)
        merch = np.array([_pick(rng, w.online_foreign, 1)[0] if f or not len(w.online.get(int(m), []))
                          else _pick(rng, w.online[int(m)], 1)[0] for m, f in zip(mccs, foreign)])
    med = np.median(amounts[amounts > 0]) if (amounts > 0).any() else 40.0
    amount = np.round(med * rng.uniform(*bh.ato_amount_factor, k), 2)
    b = txn_block(k, t=t, merchant=merch, amount=amount, entry=4, auth=rng.choice([5, 3], k), device=device, tz=tz)
    if rng.random() < bh.ato_verification_share:
        b = _concat([txn_block(1, t=t[0] - 30, merchant=merch[0], amount=0.0, txn_type=3, entry=4, auth=5,
                            device=device, tz=tz), b])
    return b


def lost_stolen_block(rng: np.random.Generator, w: World, home_city: int, difficulty: float, tz: int,
                      start_range: tuple[int, int], behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """A lost/stolen-card spree (defaults of ``behaviour``): 4-12 contactless no-CVM purchases of
    $60-99.90 (difficulty 0: $95-99.90) within 1-6 h at merchants of ``home_city`` in grocery /
    liquor / fuel / fast-food / misc MCCs, starting at a time drawn from ``start_range``. Returns a
    block of transaction columns."""
    bh = behaviour
    k = int(rng.integers(*bh.ls_purchases))
    t = int(rng.integers(*start_range)) + np.sort(rng.uniform(0, rng.uniform(*bh.ls_hours) * 3600, k)).astype(np.int64)
    mccs = rng.choice([MI[x] for x in LS_MCCS], k)
    merch = np.array([_pick(rng, w.phys.get((home_city, int(mm)), w.phys_mcc[int(mm)]), 1)[0] for mm in mccs])
    lo, hi = bh.ls_amount if difficulty > 0 else bh.ls_amount_easy
    return txn_block(k, t=t, merchant=merch, amount=np.round(rng.uniform(lo, hi, k), 2), entry=1, auth=2, tz=tz)


def _label_delay(rng, n: int, behaviour: BehaviourConfig) -> np.ndarray:
    """Seconds from a case's end to its label, one per case."""
    lo, hi = behaviour.label_delay_days
    return np.clip(rng.lognormal(np.log(behaviour.label_delay_median_days), behaviour.label_delay_sigma, n), lo, hi) * 86400


def _customer_history(idx: int, cfg: SynthConfig, world: World, ct_events: list[dict], seed_seq) -> tuple:
    """All transactions, the profile row and the fraud cases of customer ``idx``."""
    rng = np.random.default_rng(seed_seq)
    cust = _Customer(idx, cfg, world, rng)
    start = pd.Timestamp(cfg.start, tz="UTC")
    days = pd.date_range(start, periods=cfg.n_days, freq="D")
    hist = cust.legit(start.weekday(), days.day.to_numpy())
    d, w, bh = cfg.difficulty, world, cfg.behaviour
    period = cfg.n_days * 86400
    lam = {p: cfg.pattern_mix.get(p, 0) * cfg.target_fraud_rate * cust.expected / CASE_SIZE[p] for p in PATTERNS}
    blocks, cases = [hist], []
    tz0 = int(w.city_tz[cust.home])
    home_lat, home_lon = w.city_lat[:w.n_home], w.city_lon[:w.n_home]

    def case_row(kind, b, extra=None):
        cases.append({"case": len(cases), "fraud_type": kind, "start": int(b["t"].min()), "end": int(b["t"].max()),
                      "n_txns": len(b["t"]), "compromise_merchant": extra})
        b["fraud"][:] = 1
        b["case"][:] = len(cases) - 1
        blocks.append(b)

    # account takeover
    for _ in range(rng.poisson(lam["account_takeover"])):
        b = account_takeover_block(rng, w, cust.mcc_w, hist["amount"], d, tz0, 10_000 + len(cases), (0, period), bh)
        case_row("account_takeover", b)
    # counterfeit after a compromise: exposure at a compromised fuel/ATM merchant, later a swipe spree far away
    for _ in range(rng.poisson(lam["counterfeit_after_compromise"]) if len(w.compromised) else 0):
        m, s, e = w.compromised[int(rng.integers(len(w.compromised)))]
        t_exp = int(rng.integers(s * 86400, e * 86400))
        tz_m = int(w.city_tz[w.m_city[m]])
        amt = round(float(rng.lognormal(np.log(MCC_MED[w.m_mcc[m]]), bh.cf_exposure_sigma)), 2)
        expo = txn_block(1, t=t_exp, merchant=m, amount=amt,
                         entry=0, auth=0, tz=tz_m, txn_type=2 if w.m_mcc[m] == MI[6011] else 0)
        blocks.append(expo)
        k = int(rng.integers(*bh.cf_purchases))
        t0 = t_exp + int(rng.integers(*bh.cf_delay_days)) * 86400
        t = t0 + np.sort(rng.uniform(0, rng.uniform(*bh.cf_spread_days) * 86400, k)).astype(np.int64)
        dist = np.hypot(home_lat - w.city_lat[cust.home], (home_lon - w.city_lon[cust.home]) * 0.8) * KM_PER_DEG
        far = np.flatnonzero(dist > bh.cf_far_km)
        abroad = rng.random() < bh.cf_abroad_share or not len(far)
        city = int(rng.integers(w.n_home, len(w.city_lat))) if abroad else int(rng.choice(far))
        mccs = rng.choice([MI[x] for x in CF_MCCS], k)
        merch = np.array([_pick(rng, w.phys.get((city, int(mm)), w.phys_mcc[int(mm)]), 1)[0] for mm in mccs])
        mult = rng.uniform(*(bh.cf_amount_factor if d > 0 else bh.cf_amount_factor_easy), k)
        atm = mccs == MI[6011]
        resp = np.where(atm & (rng.random(k) < bh.cf_atm_bad_pin_share), 2, 0)
        b = txn_block(k, t=t, merchant=merch, amount=np.round(MCC_MED[mccs] * mult, 2), entry=2,
                   auth=np.where(atm, 0, 1), response=resp, txn_type=np.where(atm, 2, 0), tz=int(w.city_tz[city]))
        case_row("counterfeit_after_compromise", b, extra=int(m))
    # lost or stolen card: a contactless spree just under the CVM limit, then a new card
    card_changes = []
    for _ in range(rng.poisson(lam["lost_stolen"])):
        b = lost_stolen_block(rng, w, cust.home, d, tz0, (0, period), bh)
        t = b["t"]
        case_row("lost_stolen", b)
        card_changes.append((int(t[-1]), int(t[-1] + rng.uniform(*bh.ls_new_card_days) * 86400)))
    # card testing (drawn at campaign level)
    for ev in ct_events:
        b = txn_block(len(ev["t"]), t=ev["t"], merchant=ev["merchant"], amount=ev["amount"], txn_type=ev["txn_type"],
                   entry=4, auth=ev["auth"], device=ev["device"], response=ev["response"], tz=tz0)
        case_row("card_testing", b)
    out = _concat(blocks)
    keep = (out["t"] >= 0) & (out["t"] < period)
    for end, resume in card_changes:  # silence after the block, then the customer's new card
        keep &= ~((out["t"] > end) & (out["t"] < resume) & (out["fraud"] == 0))
        out["card"] += (out["t"] >= resume).astype(np.int64)
    out = {c: v[keep] for c, v in out.items()}
    order = np.lexsort((np.arange(len(out["t"])), out["t"]))
    out = {c: v[order] for c, v in out.items()}
    profile = {"customer_id": f"C{idx:06d}", "home_lat": cust.home_lat, "home_lon": cust.home_lon,
               "home_city": f"city_{cust.home:02d}", "home_country": "US", "archetype": cust.arch,
               "income_band": cust.income_band}
    delays = _label_delay(rng, len(cases), bh)
    for c, dl in zip(cases, delays):
        c["label_delay"] = float(dl)
    return out, profile, cases


def _card_testing(cfg: SynthConfig, world: World, rng: np.random.Generator) -> dict[int, list[dict]]:
    """Campaigns: a fraud device and 1-2 online merchants hit 5-40 customers within 2 h."""
    mean_rate = np.mean([a[0] for a in ARCHETYPES.values()]) * 1.07
    total = cfg.pattern_mix.get("card_testing", 0) * cfg.target_fraud_rate * mean_rate * cfg.n_days * cfg.n_customers
    # the victim count is drawn once (so the realised rate is not at the mercy of a few big campaigns),
    # then cut into campaigns of 5-40 victims
    n_victims = min(cfg.n_customers * 3, int(rng.poisson(total / CASE_SIZE["card_testing"]))) if total > 0 else 0
    sizes = []
    while sum(sizes) < n_victims:
        sizes.append(min(int(rng.integers(*cfg.behaviour.ct_victims)), n_victims - sum(sizes), cfg.n_customers))
    pool = np.concatenate([world.online.get(MI[m], np.zeros(0, int)) for m in CT_MCCS])
    cashout = np.concatenate([world.online.get(MI[m], np.zeros(0, int)) for m in (5732, 6540, 5944)])
    events: dict[int, list[dict]] = {}
    d = cfg.difficulty
    for c, size in enumerate(sizes):
        merchants = _pick(rng, pool, int(rng.integers(*cfg.behaviour.ct_merchants)))
        t0 = int(rng.integers(0, cfg.n_days * 86400))
        victims = rng.choice(cfg.n_customers, size, replace=False)
        for v in victims:
            events.setdefault(int(v), []).append(card_testing_attempts(rng, merchants, cashout, t0, 20_000 + c, d,
                                                                       cfg.behaviour))
    return events


def card_testing_attempts(rng: np.random.Generator, merchants: np.ndarray, cashout: np.ndarray, t0: int, device: int,
                          difficulty: float, behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """One victim's card-testing attempts (defaults of ``behaviour``): 3-20 tries at ``merchants``
    from ``device``, 5 s-10 min apart, starting within 2 h of ``t0`` (seconds from the bank's start);
    $0 verifications or $0.50-12 charges, 40% declined; when any went through, w.p. 0.6 one to three
    cash-out purchases ($200-1,500 at ``cashout`` merchants) 10 min-24 h later. Returns the event
    columns ``t``, ``merchant``, ``amount``, ``txn_type``, ``auth``, ``device``, ``response``."""
    bh = behaviour
    k = int(rng.integers(*bh.ct_attempts))
    t = t0 + int(rng.integers(0, bh.ct_start_s)) + np.cumsum(rng.integers(*bh.ct_gap_s, k))
    zero = rng.random(k) < bh.ct_zero_share
    lo, hi = bh.ct_amount if difficulty > 0 else bh.ct_amount_easy
    amount = np.where(zero, 0.0, np.round(rng.uniform(lo, hi, k), 2))
    declined = rng.random(k) < bh.ct_decline_share
    resp = np.where(declined, rng.choice([3, 4, 5], k, p=list(bh.ct_decline_mix)), 0)
    ev = {"t": t, "merchant": _pick(rng, merchants, k), "amount": amount, "txn_type": np.where(zero, 3, 0),
          "auth": np.full(k, 5), "device": np.full(k, device), "response": resp}
    if (~declined).any() and rng.random() < bh.ct_cashout_share and len(cashout):
        j = int(rng.integers(*bh.ct_cashouts))
        tc = t[-1] + int(rng.integers(*bh.ct_cashout_delay_s)) + np.cumsum(rng.integers(*bh.ct_cashout_gap_s, j))
        ev = {"t": np.r_[t, tc], "merchant": np.r_[ev["merchant"], _pick(rng, cashout, j)],
              "amount": np.r_[amount, np.round(rng.uniform(*bh.ct_cashout_amount, j), 2)],
              "txn_type": np.r_[ev["txn_type"], np.zeros(j, int)], "auth": np.r_[ev["auth"], np.full(j, 3)],
              "device": np.r_[ev["device"], np.full(j, device)], "response": np.r_[resp, np.zeros(j, int)]}
    return ev


def _streams(cfg: SynthConfig) -> list[np.random.SeedSequence]:
    """The four independent streams of ``cfg``'s seed: world, merchants, card-testing campaigns,
    customers (each customer spawns its own from the last)."""
    return np.random.SeedSequence(int(cfg.seed)).spawn(4)


def world_of(cfg: SynthConfig) -> World:
    """The world (cities, merchants, compromised merchants) that :func:`generate` builds for ``cfg``."""
    s_world, s_merch, _, _ = _streams(cfg.validate())
    return build_world(cfg, np.random.default_rng(s_world), np.random.default_rng(s_merch))


def _mean_int(r: tuple[int, int]) -> float:
    """Mean of numpy's ``integers(lo, hi)``: ``(lo + hi - 1) / 2``."""
    return (r[0] + r[1] - 1) / 2


def expected_fraud_counts(cfg: SynthConfig, first_day: float = 0.0, last_day: float | None = None) -> dict[str, dict]:
    """How much fraud the bank of ``cfg`` holds in its days ``[first_day, last_day)`` (default: to the end),
    per pattern, without generating a customer: ``pattern -> {"cases", "frauds", "exact"}``.

    Card testing is exact (``exact: True``): its campaigns are drawn once for the bank from the seed, so
    its cases (victims with an attempt or cash-out in the days) and frauds (those transactions) are
    counted. The other three are expectations over the customers' draws: customer ``i`` draws
    ``Poisson(share x target rate x expected legitimate count / CASE_SIZE)`` cases of a pattern, whose
    mean over the archetypes (the rate multiplier has mean 1) is used; a case counts when it starts in the
    days (account takeover, lost/stolen: start uniform over the bank; counterfeit: the exposure uniform
    in a compromise window of the bank's world, the spree 3-30 days later), times its mean number of
    fraudulent transactions. A case that starts before ``first_day`` and runs into it is not counted, so
    the expected cases of a period are slightly low. Cheap (the world and the campaigns only): it sizes
    presets (``large``: the test period's fraud) and a test checks it against generated banks.
    """
    cfg.validate()
    bh = cfg.behaviour
    lo, hi = float(first_day), float(cfg.n_days if last_day is None else last_day)
    s_world, s_merch, s_fraud, _ = _streams(cfg)
    world = build_world(cfg, np.random.default_rng(s_world), np.random.default_rng(s_merch))
    out: dict[str, dict] = {}
    cases = frauds = 0
    for evs in _card_testing(cfg, world, np.random.default_rng(s_fraud)).values():
        for ev in evs:
            k = int(((ev["t"] >= lo * 86400) & (ev["t"] < hi * 86400) & (ev["t"] < cfg.n_days * 86400)).sum())
            cases, frauds = cases + (k > 0), frauds + k
    out["card_testing"] = {"cases": float(cases), "frauds": float(frauds), "exact": True}
    start = pd.Timestamp(cfg.start, tz="UTC")
    dom = pd.date_range(start, periods=cfg.n_days, freq="D").day.to_numpy()
    legit = np.mean([a[0] for a in ARCHETYPES.values()]) * day_factors(bh, start.weekday(), dom).sum()
    uniform = max(0.0, min(hi, cfg.n_days) - max(lo, 0.0)) / cfg.n_days
    share = {"account_takeover": uniform, "lost_stolen": uniform, "counterfeit_after_compromise": 0.0}
    if len(world.compromised):  # spree start uniform in [s + d, e + d) days for window [s, e) and delay d
        d = np.arange(*bh.cf_delay_days)[None, :]
        s, e = world.compromised[:, 1:2].astype(float), world.compromised[:, 2:3].astype(float)
        overlap = np.clip(np.minimum(e + d, min(hi, cfg.n_days)) - np.maximum(s + d, lo), 0, None)
        share["counterfeit_after_compromise"] = float((overlap / (e - s)).mean())
    size = {"account_takeover": _mean_int(bh.ato_purchases) + bh.ato_verification_share,
            "counterfeit_after_compromise": _mean_int(bh.cf_purchases), "lost_stolen": _mean_int(bh.ls_purchases)}
    for p in ("account_takeover", "counterfeit_after_compromise", "lost_stolen"):
        n = cfg.n_customers * cfg.pattern_mix.get(p, 0) * cfg.target_fraud_rate * legit / CASE_SIZE[p] * share[p]
        out[p] = {"cases": float(n), "frauds": float(n * size[p]), "exact": False}
    return {p: out[p] for p in PATTERNS}


def blocks_to_frame(blocks: list[dict], w: World, cfg: SynthConfig, customer: int, first_k: int,
                    fraud_type: str | None = None, case: int = 0) -> pd.DataFrame:
    """Transaction rows (the exported columns) of ``customer`` from generator blocks, numbered from
    ``first_k``; with ``fraud_type`` every row is a fraud of case ``case`` whose label is available
    at the case's end."""
    h = _concat(blocks)
    h["cust"] = np.full(len(h["t"]), customer)
    h["k"] = first_k + np.arange(len(h["t"]))
    rows = []
    if fraud_type is not None:
        h["fraud"][:] = 1
        h["case"][:] = case
        rows = [{"customer": customer, "case": case, "fraud_type": fraud_type, "end": int(h["t"].max()),
                 "label_delay": 0.0}]
    return _to_frame([h], w, pd.Timestamp(cfg.start, tz="UTC"), rows)


def generate(cfg: SynthConfig, chunk_size: int = 500, progress: bool = False) -> SynthData:
    """Generate the bank of ``cfg`` (identical for every ``chunk_size``)."""
    cfg.validate()
    s_world, s_merch, s_fraud, s_cust = _streams(cfg)
    world = build_world(cfg, np.random.default_rng(s_world), np.random.default_rng(s_merch))
    ct = _card_testing(cfg, world, np.random.default_rng(s_fraud))
    start = pd.Timestamp(cfg.start, tz="UTC")
    frames, profiles, case_rows = [], [], []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.n_customers, desc="customers", unit="cust")
    for lo in range(0, cfg.n_customers, chunk_size):
        chunk = []
        for i in range(lo, min(cfg.n_customers, lo + chunk_size)):
            seq = np.random.SeedSequence(s_cust.entropy, spawn_key=(*s_cust.spawn_key, i))
            hist, prof, cases = _customer_history(i, cfg, world, ct.get(i, []), seq)
            hist["cust"] = np.full(len(hist["t"]), i)
            hist["k"] = np.arange(len(hist["t"]))
            chunk.append(hist)
            profiles.append(prof)
            for c in cases:
                case_rows.append({**c, "customer": i})
        frames.append(_to_frame(chunk, world, start, case_rows))
        if bar:
            bar.update(min(cfg.n_customers, lo + chunk_size) - lo)
    if bar:
        bar.close()
    txns = pd.concat(frames, ignore_index=True)
    for col in ("merchant_city", "device_id", "fraud_type", "fraud_case_id"):
        txns[col] = txns[col].astype("str")  # one dtype whatever a chunk held
    txns = txns.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)
    cases = pd.DataFrame([{
        "case_id": f"F{r['customer']:06d}_{r['case']:02d}", "customer_id": f"C{r['customer']:06d}",
        "fraud_type": r["fraud_type"], "start": start + pd.to_timedelta(r["start"], unit="s"),
        "end": start + pd.to_timedelta(r["end"], unit="s"), "n_txns": r["n_txns"],
        "compromise_merchant_id": None if r["compromise_merchant"] is None else f"M{r['compromise_merchant']:06d}",
    } for r in case_rows], columns=["case_id", "customer_id", "fraud_type", "start", "end", "n_txns",
                                    "compromise_merchant_id"])
    merchants = _merchant_table(world, start)
    return SynthData(txns, pd.DataFrame(profiles), merchants, cases)


def _to_frame(chunk: list[dict], w: World, start, case_rows: list[dict]) -> pd.DataFrame:
    h = {c: np.concatenate([x[c] for x in chunk]) for c in (*COLS, "cust", "k")}
    m = h["merchant"]
    ts = start + pd.to_timedelta(h["t"], unit="s")
    case_lookup = {(r["customer"], r["case"]): r for r in case_rows}
    fraud = h["fraud"].astype(bool)
    ftype = np.array([None] * len(m), dtype=object)
    fcase = np.array([None] * len(m), dtype=object)
    avail = np.full(len(m), np.nan)
    for i in np.flatnonzero(fraud):
        r = case_lookup[(int(h["cust"][i]), int(h["case"][i]))]
        ftype[i], fcase[i] = r["fraud_type"], f"F{int(h['cust'][i]):06d}_{r['case']:02d}"
        avail[i] = r["end"] + round(r["label_delay"])
    label_at = start + pd.to_timedelta(np.where(fraud, avail, 0), unit="s")
    dev = h["device"]
    own = np.char.add(np.char.add(np.char.add("D", h["cust"].astype(str)), "_"), dev.astype(str))
    campaign = np.char.add("FD", (dev - 20_000).astype(str))  # card-testing devices are shared across victims
    device = np.where(dev >= 20_000, campaign, np.where(dev >= 0, own, None))
    return pd.DataFrame({
        "transaction_id": np.char.add(np.char.add("T", np.char.zfill(h["cust"].astype(str), 6)),
                                      np.char.zfill(h["k"].astype(str), 5)),
        "customer_id": np.char.add("C", np.char.zfill(h["cust"].astype(str), 6)),
        "card_id": np.char.add(np.char.add(np.char.add("K", np.char.zfill(h["cust"].astype(str), 6)), "_"),
                               h["card"].astype(str)),
        "timestamp": ts.astype("datetime64[us, UTC]"),
        "tz_offset_min": h["tz"].astype(np.int16),
        "amount": h["amount"].round(2),
        "currency": np.where(w.m_online[m], np.where(w.m_country[m] == "US", "USD", w.m_currency[m]), w.m_currency[m]),
        "txn_type": np.array(TXN_TYPES)[h["txn_type"]],
        "mcc": MCC[w.m_mcc[m]].astype(np.int64),
        "merchant_id": np.char.add("M", np.char.zfill(m.astype(str), 6)),
        "merchant_name": np.char.add("Merchant ", m.astype(str)),
        "merchant_city": np.where(w.m_city[m] >= 0, np.char.add("city_", w.m_city[m].astype(str)), None),
        "merchant_country": w.m_country[m],
        "merchant_lat": w.m_lat[m].round(5),
        "merchant_lon": w.m_lon[m].round(5),
        "entry_mode": np.array(ENTRY)[h["entry"]],
        "auth_method": np.array(AUTH)[h["auth"]],
        "device_id": device,
        "response_code": np.array(RESP)[h["response"]],
        "is_fraud": fraud.astype(np.int8),
        "fraud_type": ftype,
        "fraud_case_id": fcase,
        "label_available_at": pd.Series(label_at.astype("datetime64[us, UTC]")).where(fraud),
    })


def _merchant_table(w: World, start) -> pd.DataFrame:
    n = len(w.m_mcc)
    comp_from = np.full(n, np.nan)
    comp_to = np.full(n, np.nan)
    for m, s, e in w.compromised:
        comp_from[m], comp_to[m] = s * 86400, e * 86400
    has = ~np.isnan(comp_from)
    return pd.DataFrame({
        "merchant_id": [f"M{i:06d}" for i in range(n)], "name": [f"Merchant {i}" for i in range(n)],
        "mcc": MCC[w.m_mcc], "is_online": w.m_online,
        "city": [f"city_{c}" if c >= 0 else None for c in w.m_city], "country": w.m_country,
        "lat": w.m_lat, "lon": w.m_lon,
        "compromised_from": pd.Series(start + pd.to_timedelta(np.nan_to_num(comp_from), unit="s")).where(has),
        "compromised_to": pd.Series(start + pd.to_timedelta(np.nan_to_num(comp_to), unit="s")).where(has),
    })
