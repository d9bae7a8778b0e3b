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
# the mean number of fraudulent transactions of a case: a pattern's case rate is its fraud share / this
CASE_SIZE = {"card_testing": 12.0, "account_takeover": 4.0, "counterfeit_after_compromise": 5.0, "lost_stolen": 8.0}

# -- merchant categories: one row each ---------------------------------------------------------------
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
MCC = np.array([row[0] for row in MCC_TABLE])  # the codes; the generator works with their rows (indices)
MCC_WEIGHT = np.array([row[2] for row in MCC_TABLE], float)
MCC_MEDIAN = np.array([row[3] for row in MCC_TABLE], float)
MCC_SIGMA = np.array([row[4] for row in MCC_TABLE], float)
MCC_ONLINE = np.array([row[5] for row in MCC_TABLE], float)
MCC_RECURRING = np.array([row[7] for row in MCC_TABLE])  # bought by monthly subscription only
MCC_INDEX = {code: index for index, code in enumerate(MCC)}  # code -> row
FUEL, ATM, MONEY_TRANSFER = MCC_INDEX[5541], MCC_INDEX[6011], MCC_INDEX[4829]


def _hour_weights() -> np.ndarray:
    """``[n_mcc, 24]``: per MCC, a Gaussian bump (sigma 2 h, wrapping at midnight) at each of its peak hours."""
    hours = np.arange(24)
    weights = np.zeros((len(MCC), 24))
    for index, row in enumerate(MCC_TABLE):
        for peak in row[6]:
            distance = np.minimum(np.abs(hours - peak), 24 - np.abs(hours - peak))
            weights[index] += np.exp(-0.5 * (distance / 2.0) ** 2)
    return weights


HOUR_WEIGHT = _hour_weights()

# -- customers and places ------------------------------------------------------------------------------
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
ARCHETYPE_NAMES = list(ARCHETYPES)
WEEKDAY_FACTOR = np.array([1, 1, 1, 1, 1.15, 1.3, 0.9])  # Monday .. Sunday
NIGHT_HOURS = np.r_[np.ones(6), np.zeros(16), np.ones(2)]  # 22:00 - 05:59
# iso, currency, latitude, longitude of each foreign country (three cities around that point)
FOREIGN_COUNTRIES = [
    ("CA", "CAD", 50, -100), ("MX", "MXN", 23, -102), ("GB", "GBP", 53, -1), ("FR", "EUR", 46, 2),
    ("DE", "EUR", 51, 10), ("ES", "EUR", 40, -4), ("IT", "EUR", 42, 12), ("NL", "EUR", 52, 5),
    ("JP", "JPY", 36, 138), ("CN", "CNY", 35, 105), ("IN", "INR", 21, 78), ("BR", "BRL", -10, -52),
    ("AU", "AUD", -25, 134), ("ZA", "ZAR", -30, 25), ("TH", "THB", 15, 101), ("AE", "AED", 24, 54),
    ("TR", "TRY", 39, 35), ("RU", "RUB", 56, 38), ("NG", "NGN", 9, 8), ("KR", "KRW", 36, 128),
    ("SG", "SGD", 1, 104)]
KM_PER_DEG = 111.0

# the MCCs each fraud pattern buys in (prefixes as BehaviourConfig's: ct_, ato_, cf_, ls_)
CT_MCCS, ATO_MCCS = (5818, 8398, 5968, 5814, 5999, 5815), (5732, 6540, 5944, 4829)
CT_CASHOUT_MCCS = (5732, 6540, 5944)  # card testing's cash-out purchases
CF_MCCS, LS_MCCS = (6011, 5411, 5311, 5541, 5812), (5411, 5921, 5541, 5814, 5999)
REFUND_MCCS = (5311, 5691, 5732, 5999, 5944, 5411)
# device ids: a customer's own devices count from 0; fraud devices from these offsets
TAKEOVER_DEVICE, CAMPAIGN_DEVICE = 10_000, 20_000  # + the customer's case number, + the campaign number

# -- transaction codes: a block stores each categorical column as an index into its tuple ------------
TXN_TYPES = ("purchase", "refund", "cash_withdrawal", "card_verification", "transfer")
ENTRY = ("chip", "contactless", "swipe", "manual_key", "ecommerce", "recurring")
AUTH = ("pin", "signature", "no_cvm", "3ds_frictionless", "3ds_challenge", "none")
RESP = ("approved", "insufficient_funds", "bad_pin", "bad_cvv", "bad_expiry", "do_not_honor", "invalid_card",
        "technical_error")
PURCHASE, REFUND, CASH_WITHDRAWAL, VERIFICATION, TRANSFER = range(len(TXN_TYPES))
CHIP, CONTACTLESS, SWIPE, MANUAL_KEY, ECOMMERCE, RECURRING = range(len(ENTRY))
PIN, SIGNATURE, NO_CVM, THREE_DS_FRICTIONLESS, THREE_DS_CHALLENGE, NO_AUTH = range(len(AUTH))
APPROVED, INSUFFICIENT_FUNDS, BAD_PIN, BAD_CVV, BAD_EXPIRY, DO_NOT_HONOR, INVALID_CARD, TECHNICAL_ERROR = range(len(RESP))


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
        return cls(**{key: tuple(value) if isinstance(value, list) else value for key, value in values.items()})

    def validate(self) -> BehaviourConfig:
        """Raise ``ValueError`` naming the field when a probability, mix or range is out of bounds."""
        for name in (spec.name for spec in fields(self)):
            value = getattr(self, name)
            if name.endswith(("_share", "_rate", "_cap", "device_churn")) and not 0.0 <= value <= 1.0:
                raise ValueError(f"behaviour.{name} is a probability in [0, 1], got {value!r}")
            if name.endswith("_mix") and (min(value) < 0 or abs(sum(value) - 1) > 1e-6):
                raise ValueError(f"behaviour.{name} must be probabilities summing to 1, got {value!r}")
            if isinstance(value, tuple) and not name.endswith("_mix") and not value[0] <= value[1]:
                raise ValueError(f"behaviour.{name} must be a range (lo, hi) with lo <= hi, got {value!r}")
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
        if not 0 < self.n_foreign_countries <= len(FOREIGN_COUNTRIES):
            raise ValueError(f"n_foreign_countries must be in [1, {len(FOREIGN_COUNTRIES)}], got {self.n_foreign_countries}")
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
    """A generated bank: its four tables, as :func:`~slmlab.transactions.data.bank.export` writes them."""

    transactions: pd.DataFrame
    customers: pd.DataFrame
    merchants: pd.DataFrame
    fraud_cases: pd.DataFrame


# -- world and merchants --------------------------------------------------------------------------
@dataclass
class World:
    """The bank's cities and merchants. Cities: the home cities first, then three per foreign country;
    merchants: the physical ones first, then the online ones. An MCC here is a row of :data:`MCC_TABLE`."""

    city_lat: np.ndarray
    city_lon: np.ndarray
    city_country: np.ndarray  # "US" or ISO code
    city_currency: np.ndarray
    city_tz: np.ndarray  # UTC offset, minutes
    city_population: np.ndarray  # share of the customers living there (foreign cities: 0)
    n_home_cities: int
    merchant_mcc: np.ndarray
    merchant_city: np.ndarray  # -1 for online
    merchant_lat: np.ndarray  # NaN for online
    merchant_lon: np.ndarray
    merchant_online: np.ndarray
    merchant_legacy: np.ndarray  # a terminal that only swipes
    merchant_price: np.ndarray  # price level, a factor on the MCC's median amount
    merchant_country: np.ndarray
    merchant_currency: np.ndarray
    physical_at: dict  # (city, mcc) -> physical merchants
    physical_by_mcc: dict  # mcc -> physical merchants
    online: dict  # mcc -> home-country online merchants
    online_foreign: np.ndarray  # online merchants based abroad
    compromised: np.ndarray  # [n, 3]: merchant, first day, end day (exclusive) of its skimming
    physical: np.ndarray  # every physical merchant


def build_world(cfg: SynthConfig, rng_world: np.random.Generator, rng_merch: np.random.Generator) -> World:
    """The cities (drawn from ``rng_world``) and the merchants (from ``rng_merch``) of ``cfg``."""
    behaviour = cfg.behaviour
    n_home = cfg.n_home_cities
    # cities: home cities scattered over the US, then three around each foreign country's point
    lat = list(rng_world.uniform(30, 47, n_home))
    lon = list(rng_world.uniform(-122, -72, n_home))
    country, currency = ["US"] * n_home, ["USD"] * n_home
    for iso, country_currency, country_lat, country_lon in FOREIGN_COUNTRIES[: cfg.n_foreign_countries]:
        for _ in range(3):
            lat.append(country_lat + rng_world.uniform(-3, 3))
            lon.append(country_lon + rng_world.uniform(-3, 3))
            country.append(iso)
            currency.append(country_currency)
    lat, lon = np.array(lat), np.array(lon)
    n_cities = len(lat)
    tz = (np.round(lon / 15) * 60).astype(np.int64)
    population = np.zeros(n_cities)
    population[:n_home] = 1.0 / np.arange(1, n_home + 1)  # Zipf over the home cities
    population /= population.sum()
    # physical merchants: an in-store MCC, in a home city by population (some abroad), ~15 km from its centre
    n_physical, n_online = cfg.n_physical_merchants, cfg.n_online_merchants
    in_store = MCC_WEIGHT * (1 - MCC_ONLINE) * ~MCC_RECURRING
    physical_mcc = rng_merch.choice(len(MCC), n_physical, p=in_store / in_store.sum())
    home_city = rng_merch.choice(n_home, n_physical, p=population[:n_home])
    abroad = rng_merch.random(n_physical) < behaviour.merchant_abroad_share
    physical_city = np.where(abroad, rng_merch.integers(n_home, n_cities, n_physical), home_city)
    physical_lat = lat[physical_city] + rng_merch.normal(0, 15 / KM_PER_DEG, n_physical)
    physical_lon = (lon[physical_city]
                    + rng_merch.normal(0, 15 / KM_PER_DEG, n_physical) / np.cos(np.radians(lat[physical_city])))
    # online merchants: an online MCC; some are based abroad (their country and currency)
    online_weight = MCC_WEIGHT * MCC_ONLINE
    online_mcc = rng_merch.choice(len(MCC), n_online, p=online_weight / online_weight.sum())
    online_abroad = rng_merch.random(n_online) < behaviour.online_foreign_share
    online_base = np.where(online_abroad, rng_merch.integers(n_home, n_cities, n_online), 0)
    based_in = np.concatenate([physical_city, online_base])
    legacy = np.concatenate([rng_merch.random(n_physical) < behaviour.legacy_terminal_share, np.zeros(n_online, bool)])
    price = rng_merch.lognormal(0, behaviour.merchant_price_sigma, n_physical + n_online)
    # where a customer finds a merchant: physical by (city, MCC) and by MCC, online by MCC
    physical_at: dict = {}
    for merchant, (city, mcc) in enumerate(zip(physical_city, physical_mcc)):
        physical_at.setdefault((int(city), int(mcc)), []).append(merchant)
    physical_at = {key: np.array(merchants) for key, merchants in physical_at.items()}
    physical_by_mcc = {mcc: np.flatnonzero(physical_mcc == mcc) for mcc in range(len(MCC))}
    online = {mcc: n_physical + np.flatnonzero((online_mcc == mcc) & ~online_abroad) for mcc in range(len(MCC))}
    # compromised fuel/ATM terminals in home cities, each skimming for behaviour.compromise_days
    candidates = np.flatnonzero(np.isin(physical_mcc, [FUEL, ATM]) & (physical_city < n_home))
    n_compromised = max(2, n_physical // 1500) * max(1, cfg.n_days // 30)
    chosen = (rng_merch.choice(candidates, min(n_compromised, len(candidates)), replace=False) if len(candidates)
              else np.zeros(0, int))
    first_day = rng_merch.integers(0, max(1, cfg.n_days - (behaviour.compromise_days[1] - 1)), len(chosen))
    compromised = np.stack([chosen, first_day, first_day + rng_merch.integers(*behaviour.compromise_days, len(chosen))],
                           1)
    return World(
        city_lat=lat, city_lon=lon, city_country=np.array(country), city_currency=np.array(currency), city_tz=tz,
        city_population=population, n_home_cities=n_home, merchant_mcc=np.concatenate([physical_mcc, online_mcc]),
        merchant_city=np.concatenate([physical_city, np.full(n_online, -1)]),
        merchant_lat=np.concatenate([physical_lat, np.full(n_online, np.nan)]),
        merchant_lon=np.concatenate([physical_lon, np.full(n_online, np.nan)]),
        merchant_online=np.concatenate([np.zeros(n_physical, bool), np.ones(n_online, bool)]),
        merchant_legacy=legacy, merchant_price=price, merchant_country=np.array(country)[based_in],
        merchant_currency=np.array(currency)[based_in], physical_at=physical_at, physical_by_mcc=physical_by_mcc,
        online=online, online_foreign=n_physical + np.flatnonzero(online_abroad), compromised=compromised,
        physical=np.arange(n_physical))


# -- transaction blocks: one array per column (COLS), the codes of TXN_TYPES, ENTRY, AUTH, RESP -----------
COLS = ("t", "merchant", "amount", "txn_type", "entry", "auth", "device", "response", "fraud", "case", "card", "tz")


def txn_block(n: int, **cols) -> dict:
    """``n`` transactions as generator columns (:data:`COLS`), ``cols`` broadcast over them."""
    out = {column: np.zeros(n, np.int64) for column in COLS}
    out["amount"] = np.zeros(n, float)
    out["device"] = np.full(n, -1, np.int64)
    out["case"] = np.full(n, -1, np.int64)
    for column, value in cols.items():
        out[column] = np.broadcast_to(np.asarray(value, dtype=out[column].dtype), n).copy()
    return out


def _concat(blocks: list[dict]) -> dict:
    """One block of the rows of ``blocks``, in order."""
    return {column: np.concatenate([block[column] for block in blocks]) for column in COLS}


def _pick(rng, pool: np.ndarray, count: int) -> np.ndarray:
    """``count`` draws from ``pool``, with replacement."""
    return pool[rng.integers(0, len(pool), count)]


def day_factors(behaviour: BehaviourConfig, start_weekday: int, start_dom: np.ndarray) -> np.ndarray:
    """Each day's spending factor (weekday x payday), for days starting on weekday ``start_weekday``
    (Monday = 0) whose days of the month are ``start_dom``: a customer's expected legitimate count on
    day ``d`` is its rate times ``factor[d]``."""
    days = np.arange(len(start_dom))
    payday = np.where(np.isin(start_dom, (1, 2, 15, 16)), behaviour.payday_boost, 1.0)
    return WEEKDAY_FACTOR[(start_weekday + days) % 7] * payday


# -- one customer's legitimate history ---------------------------------------------------------------
class _Customer:
    """One customer: the profile drawn at construction, then :meth:`legitimate`, its legitimate
    history; every draw comes from the customer's own stream ``rng``, in a fixed order."""

    def __init__(self, idx: int, cfg: SynthConfig, world: World, rng: np.random.Generator) -> None:
        self.idx, self.cfg, self.world, self.rng = idx, cfg, world, rng
        behaviour = cfg.behaviour
        # profile: an archetype, a home (by population), personal rate and amount multipliers
        self.archetype = ARCHETYPE_NAMES[rng.integers(len(ARCHETYPE_NAMES))]
        rate, amount_factor, self.online_factor, self.night, self.trips, boosts = ARCHETYPES[self.archetype]
        self.home = int(rng.choice(world.n_home_cities, p=world.city_population[: world.n_home_cities]))
        self.home_lat = world.city_lat[self.home] + rng.normal(0, 5 / KM_PER_DEG)
        self.home_lon = world.city_lon[self.home] + rng.normal(0, 5 / KM_PER_DEG)
        self.rate = rate * rng.gamma(behaviour.rate_shape, 1 / behaviour.rate_shape)
        self.amount_mult = amount_factor * rng.lognormal(0, behaviour.amount_mult_sigma)
        # the MCC mix: the archetype's boosted weights, Dirichlet-scattered (recurring MCCs only by subscription)
        base = MCC_WEIGHT * ~MCC_RECURRING
        for code, boost in boosts.items():
            base[MCC_INDEX[code]] *= boost
        self.mcc_weights = (rng.dirichlet(behaviour.mcc_concentration * base / base.sum() + 1e-9 * ~MCC_RECURRING)
                            * ~MCC_RECURRING)
        self.mcc_weights /= self.mcc_weights.sum()
        self.n_devices = int(rng.integers(*behaviour.devices))
        self.income_band = ["low", "mid", "high"][min(2, int(self.amount_mult > 1) + int(self.amount_mult > 2))]

    def legitimate(self, start_weekday: int, start_dom: np.ndarray) -> dict:
        """The legitimate transactions of the bank's days (days of the month ``start_dom``) as one block:
        purchases, $0 verifications, refunds, subscriptions. Sets :attr:`expected`, the expected number
        of purchases."""
        factor = day_factors(self.cfg.behaviour, start_weekday, start_dom)
        self.expected = float(self.rate * factor.sum())
        counts = self.rng.poisson(self.rate * factor)
        city_of_day = self._travel()
        purchases, online, favourite = self._purchases(np.repeat(np.arange(self.cfg.n_days), counts), city_of_day)
        return _concat([purchases, *self._verifications_and_refunds(purchases, online, favourite),
                        *self._subscriptions(start_dom)])

    def _travel(self) -> np.ndarray:
        """The city of each day: home, but for trips (abroad, or to another home city)."""
        rng, world, behaviour, n_days = self.rng, self.world, self.cfg.behaviour, self.cfg.n_days
        city_of_day = np.full(n_days, self.home)
        for _ in range(rng.poisson(self.trips / 365 * n_days)):
            first, length = int(rng.integers(n_days)), int(rng.integers(*behaviour.trip_days))
            abroad = rng.random() < behaviour.trip_abroad_share
            destination = (int(rng.integers(world.n_home_cities, len(world.city_lat))) if abroad
                           else int(rng.integers(world.n_home_cities)))
            city_of_day[first:first + length] = destination
        return city_of_day

    def _purchases(self, day: np.ndarray, city_of_day: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
        """One purchase on each of ``day`` (a day per purchase): the block, which were online, and which
        were at a favourite online merchant."""
        rng, behaviour, n = self.rng, self.cfg.behaviour, len(day)
        # what and when: an MCC of the mix, an hour at the MCC's peaks (or at night, by the night propensity)
        mcc = rng.choice(len(MCC), n, p=self.mcc_weights)
        hour_weight = HOUR_WEIGHT + self.night * NIGHT_HOURS + 0.01
        hour_cdf = np.cumsum(hour_weight / hour_weight.sum(1, keepdims=True), 1)
        hour = np.minimum((rng.random(n)[:, None] > hour_cdf[mcc]).sum(1), 23)
        local_time = day * 86400 + hour * 3600 + rng.integers(0, 3600, n)
        online = rng.random(n) < np.clip(MCC_ONLINE[mcc] * self.online_factor, 0, 1)
        merchant, favourite = self._merchants(mcc, online, city_of_day[day])
        # confounder: some online purchases at a foreign merchant
        foreign = online & (rng.random(n) < behaviour.foreign_online_share * self.cfg.difficulty) & (
            len(self.world.online_foreign) > 0)
        if foreign.any():
            merchant[foreign] = _pick(rng, self.world.online_foreign, int(foreign.sum()))
        return self._payment(merchant, online, local_time), online, favourite

    def _merchants(self, mcc: np.ndarray, online: np.ndarray, city: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each purchase's merchant, mostly a favourite: online ones by MCC, physical ones in the day's
        ``city``. Moves a purchase online where no physical merchant sells its MCC, and in store where no
        online one does (``online`` is updated in place). Returns ``(merchant, at a favourite online)``."""
        rng, world, behaviour = self.rng, self.world, self.cfg.behaviour
        merchant = np.zeros(len(mcc), np.int64)
        favourite = np.zeros(len(mcc), bool)
        for category in np.unique(mcc):
            of_category = mcc == category
            online_pool = world.online.get(int(category), np.zeros(0, int))
            if len(world.physical_by_mcc[int(category)]) == 0 and len(online_pool):
                online |= of_category  # no physical merchant sells this
            bought_online = of_category & online
            if len(online_pool) == 0:
                online &= ~of_category
                bought_online[:] = False
            else:
                favourites = _pick(rng, online_pool, int(rng.integers(*behaviour.online_favourites)))
                count = bought_online.sum()
                use = rng.random(count) < behaviour.online_favourite_share
                merchant[bought_online] = np.where(use, _pick(rng, favourites, count), _pick(rng, online_pool, count))
                favourite[bought_online] = use
            in_store = of_category & ~online
            if not in_store.any():
                continue
            home_pool = world.physical_at.get((self.home, int(category)), world.physical_by_mcc[int(category)])
            if not len(home_pool):
                home_pool = world.physical
            favourites = _pick(rng, home_pool, int(rng.integers(*behaviour.home_favourites)))
            for where in np.unique(city[in_store]):
                here = in_store & (city == where)
                count = int(here.sum())
                if where == self.home:
                    use = rng.random(count) < behaviour.home_favourite_share
                    merchant[here] = np.where(use, _pick(rng, favourites, count), _pick(rng, home_pool, count))
                else:
                    pool = world.physical_at.get((int(where), int(category)))
                    pool = pool if pool is not None else home_pool
                    merchant[here] = _pick(rng, pool, count)
        return merchant, favourite

    def _payment(self, merchant: np.ndarray, online: np.ndarray, local_time: np.ndarray) -> dict:
        """The purchases' block: amount, type, entry mode, verification, device and response at their
        ``merchant`` (times: seconds of local time from the bank's start)."""
        rng, world, behaviour, n = self.rng, self.world, self.cfg.behaviour, len(merchant)
        # amount: lognormal around the MCC's median x the customer's and the merchant's levels; rarely far above
        mcc = world.merchant_mcc[merchant]
        median = MCC_MEDIAN[mcc] * self.amount_mult * world.merchant_price[merchant]
        amount = np.round(rng.lognormal(np.log(median), MCC_SIGMA[mcc]), 2)
        big = rng.random(n) < behaviour.big_purchase_share * self.cfg.difficulty
        amount[big] = np.round(amount[big] * rng.uniform(*behaviour.big_purchase_factor, big.sum()), 2)
        # entry mode (a legacy terminal swipes; online is ecommerce) and verification
        entry = rng.choice(4, n, p=list(behaviour.entry_mix))  # chip, contactless, swipe, manual_key
        entry[world.merchant_legacy[merchant]] = SWIPE
        entry[online] = ECOMMERCE
        pin = (mcc == ATM) | ((entry == CHIP) & (rng.random(n) < behaviour.chip_pin_share))
        auth = np.where(pin, PIN, np.where((entry == CONTACTLESS) & (amount < behaviour.cvm_limit), NO_CVM, SIGNATURE))
        auth[online] = rng.choice([THREE_DS_FRICTIONLESS, THREE_DS_CHALLENGE, NO_AUTH], online.sum(),
                                  p=list(behaviour.online_auth_mix))
        txn_type = np.where(mcc == ATM, CASH_WITHDRAWAL, np.where(mcc == MONEY_TRANSFER, TRANSFER, PURCHASE))
        # online purchases use one of the customer's devices; now and then a new one replaces them
        churn = np.cumsum(online & (rng.random(n) < behaviour.device_churn))
        device = np.where(online, (rng.integers(0, self.n_devices, n) + churn), -1)
        # declines: insufficient funds (likelier for a large amount), bad PIN, bad CVV, technical errors
        median_amount = np.median(amount) if n else 1.0
        draw = rng.random(n)
        response = np.zeros(n, np.int64)
        response[draw < np.clip(behaviour.insufficient_funds_rate * amount / median_amount, 0,
                                behaviour.insufficient_funds_cap)] = INSUFFICIENT_FUNDS
        response[(auth == PIN) & (rng.random(n) < behaviour.bad_pin_rate)] = BAD_PIN
        response[online & (rng.random(n) < behaviour.bad_cvv_rate)] = BAD_CVV
        response[rng.random(n) < behaviour.technical_error_rate] = TECHNICAL_ERROR
        # online: the customer's home time zone; in store: the merchant's city's
        tz = np.where(online, world.city_tz[self.home], world.city_tz[np.maximum(world.merchant_city[merchant], 0)])
        return txn_block(n, t=local_time - tz * 60, merchant=merchant, amount=amount, txn_type=txn_type, entry=entry,
                         auth=auth, device=device, response=response, tz=tz)

    def _verifications_and_refunds(self, purchases: dict, online: np.ndarray, favourite: np.ndarray) -> list[dict]:
        """$0 verifications just before some online purchases at non-favourite merchants, and refunds of
        some retail purchases 1-14 days later (copies of those purchases)."""
        rng, behaviour = self.rng, self.cfg.behaviour
        n = len(purchases["t"])
        blocks = []
        verified = online & ~favourite & (rng.random(n) < behaviour.verification_share * self.cfg.difficulty)
        if verified.any():
            verification = {column: values[verified].copy() for column, values in purchases.items()}
            verification["t"] -= rng.integers(1, 60, verified.sum())
            verification["amount"][:] = 0.0
            verification["txn_type"][:] = VERIFICATION
            verification["response"][:] = APPROVED
            blocks.append(verification)
        mcc_codes = MCC[self.world.merchant_mcc[purchases["merchant"]]]
        refunded = np.isin(mcc_codes, REFUND_MCCS) & (rng.random(n) < behaviour.refund_share)
        if refunded.any():
            refund = {column: values[refunded].copy() for column, values in purchases.items()}
            refund["t"] += rng.integers(*behaviour.refund_days, refunded.sum()) * 86400
            refund["amount"] = -refund["amount"]
            refund["txn_type"][:] = REFUND
            refund["response"][:] = APPROVED
            blocks.append(refund)
        return blocks

    def _subscriptions(self, start_dom: np.ndarray) -> list[dict]:
        """Monthly subscriptions: a recurring MCC, a fixed online merchant, amount and day of the month."""
        rng, world = self.rng, self.world
        days = np.arange(self.cfg.n_days)
        tz = int(world.city_tz[self.home])
        blocks = []
        for _ in range(int(rng.integers(*self.cfg.behaviour.subscriptions))):
            mcc = int(rng.choice(np.flatnonzero(MCC_RECURRING)))
            pool = world.online.get(mcc, np.zeros(0, int))
            if not len(pool):
                continue
            merchant, day_of_month = int(_pick(rng, pool, 1)[0]), int(rng.integers(1, 29))
            billing_days = days[start_dom == day_of_month]
            count = len(billing_days)
            amount = round(float(rng.lognormal(np.log(MCC_MEDIAN[mcc]), MCC_SIGMA[mcc])), 2)
            blocks.append(txn_block(count, t=billing_days * 86400 + rng.integers(3, 9, count) * 3600 - tz * 60,
                                    merchant=merchant, amount=amount, entry=RECURRING, auth=NO_AUTH, tz=tz))
        return blocks


# -- the fraud patterns (the demo builds its sprees from these too) ---------------------------------------
def account_takeover_block(rng: np.random.Generator, w: World, mcc_w: np.ndarray, amounts: np.ndarray,
                           difficulty: float, tz: int, device: int, start_range: tuple[int, int],
                           behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """An account-takeover case (defaults of ``behaviour``): 2-6 online purchases within 1-48 h from a
    new ``device``, starting at a time drawn from ``start_range`` (seconds from the bank's start,
    ``[lo, hi)``); w.p. ``0.5 * difficulty`` in MCCs the customer already buys online (``mcc_w``: the
    customer's MCC weights), else in electronics / stored value / jewellery / money transfer, half of
    them at foreign merchants; amounts = the median of the customer's positive ``amounts`` x
    U(1.5, 6); w.p. 0.5 a $0 verification 30 s before. Returns a block of transaction columns."""
    world = w
    count = int(rng.integers(*behaviour.ato_purchases))
    times = int(rng.integers(*start_range)) + np.sort(
        rng.uniform(0, rng.uniform(*behaviour.ato_hours) * 3600, count)).astype(np.int64)
    pattern_mccs = [MCC_INDEX[code] for code in ATO_MCCS]
    if rng.random() < behaviour.ato_mimic_share * difficulty:  # mimic: MCCs the customer buys online
        own = np.flatnonzero((mcc_w > 0) & (MCC_ONLINE > 0.2))
        mccs = rng.choice(own, count) if len(own) else rng.choice(pattern_mccs, count)
        merchant = np.array([_pick(rng, world.online.get(int(mcc), world.online_foreign), 1)[0]
                             if len(world.online.get(int(mcc), [])) else _pick(rng, world.online_foreign, 1)[0]
                             for mcc in mccs])
    else:
        mccs = rng.choice(pattern_mccs, count)
        foreign = rng.random(count) < (behaviour.ato_foreign_share if difficulty > 0 else 1.0)
        merchant = np.array([_pick(rng, world.online_foreign, 1)[0] if abroad or not len(world.online.get(int(mcc), []))
                             else _pick(rng, world.online[int(mcc)], 1)[0] for mcc, abroad in zip(mccs, foreign)])
    median = np.median(amounts[amounts > 0]) if (amounts > 0).any() else 40.0
    amount = np.round(median * rng.uniform(*behaviour.ato_amount_factor, count), 2)
    block = txn_block(count, t=times, merchant=merchant, amount=amount, entry=ECOMMERCE,
                      auth=rng.choice([NO_AUTH, THREE_DS_FRICTIONLESS], count), device=device, tz=tz)
    if rng.random() < behaviour.ato_verification_share:
        block = _concat([txn_block(1, t=times[0] - 30, merchant=merchant[0], amount=0.0, txn_type=VERIFICATION,
                                   entry=ECOMMERCE, auth=NO_AUTH, device=device, tz=tz), block])
    return block


def lost_stolen_block(rng: np.random.Generator, w: World, home_city: int, difficulty: float, tz: int,
                      start_range: tuple[int, int], behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """A lost/stolen-card spree (defaults of ``behaviour``): 4-12 contactless no-CVM purchases of
    $60-99.90 (difficulty 0: $95-99.90) within 1-6 h at merchants of ``home_city`` in grocery /
    liquor / fuel / fast-food / misc MCCs, starting at a time drawn from ``start_range``. Returns a
    block of transaction columns."""
    world = w
    count = int(rng.integers(*behaviour.ls_purchases))
    times = int(rng.integers(*start_range)) + np.sort(
        rng.uniform(0, rng.uniform(*behaviour.ls_hours) * 3600, count)).astype(np.int64)
    mccs = rng.choice([MCC_INDEX[code] for code in LS_MCCS], count)
    merchant = np.array([_pick(rng, world.physical_at.get((home_city, int(mcc)), world.physical_by_mcc[int(mcc)]), 1)[0]
                         for mcc in mccs])
    low, high = behaviour.ls_amount if difficulty > 0 else behaviour.ls_amount_easy
    return txn_block(count, t=times, merchant=merchant, amount=np.round(rng.uniform(low, high, count), 2),
                     entry=CONTACTLESS, auth=NO_CVM, tz=tz)


def _counterfeit_case(rng: np.random.Generator, world: World, home: int, difficulty: float,
                      behaviour: BehaviourConfig) -> tuple[dict, dict, int]:
    """A counterfeit case: the customer's (legitimate) card-present transaction at a compromised fuel/ATM
    terminal while it skims, then, days later, a swipe spree in a home city far away or abroad.
    Returns ``(exposure block, spree block, the compromised merchant)``."""
    merchant, first_day, end_day = world.compromised[int(rng.integers(len(world.compromised)))]
    exposed_at = int(rng.integers(first_day * 86400, end_day * 86400))
    amount = round(float(rng.lognormal(np.log(MCC_MEDIAN[world.merchant_mcc[merchant]]), behaviour.cf_exposure_sigma)), 2)
    exposure = txn_block(1, t=exposed_at, merchant=merchant, amount=amount, entry=CHIP, auth=PIN,
                         tz=int(world.city_tz[world.merchant_city[merchant]]),
                         txn_type=CASH_WITHDRAWAL if world.merchant_mcc[merchant] == ATM else PURCHASE)
    # the spree: when, and where (a home city over cf_far_km away, else abroad)
    count = int(rng.integers(*behaviour.cf_purchases))
    spree_start = exposed_at + int(rng.integers(*behaviour.cf_delay_days)) * 86400
    times = spree_start + np.sort(
        rng.uniform(0, rng.uniform(*behaviour.cf_spread_days) * 86400, count)).astype(np.int64)
    n_home = world.n_home_cities
    distance_km = np.hypot(world.city_lat[:n_home] - world.city_lat[home],
                           (world.city_lon[:n_home] - world.city_lon[home]) * 0.8) * KM_PER_DEG
    far = np.flatnonzero(distance_km > behaviour.cf_far_km)
    abroad = rng.random() < behaviour.cf_abroad_share or not len(far)
    city = int(rng.integers(n_home, len(world.city_lat))) if abroad else int(rng.choice(far))
    # what: swiped purchases and ATM withdrawals (some declined bad_pin)
    mccs = rng.choice([MCC_INDEX[code] for code in CF_MCCS], count)
    spree_merchant = np.array([_pick(rng, world.physical_at.get((city, int(mcc)), world.physical_by_mcc[int(mcc)]), 1)[0]
                               for mcc in mccs])
    factor = rng.uniform(*(behaviour.cf_amount_factor if difficulty > 0 else behaviour.cf_amount_factor_easy), count)
    atm = mccs == ATM
    response = np.where(atm & (rng.random(count) < behaviour.cf_atm_bad_pin_share), BAD_PIN, APPROVED)
    spree = txn_block(count, t=times, merchant=spree_merchant, amount=np.round(MCC_MEDIAN[mccs] * factor, 2), entry=SWIPE,
                      auth=np.where(atm, PIN, SIGNATURE), response=response,
                      txn_type=np.where(atm, CASH_WITHDRAWAL, PURCHASE), tz=int(world.city_tz[city]))
    return exposure, spree, int(merchant)


def _label_delay(rng, n_cases: int, behaviour: BehaviourConfig) -> np.ndarray:
    """Seconds from a case's end to its label, one per case."""
    low, high = behaviour.label_delay_days
    return np.clip(rng.lognormal(np.log(behaviour.label_delay_median_days), behaviour.label_delay_sigma, n_cases),
                   low, high) * 86400


# -- one customer's history with its fraud ----------------------------------------------------------------
def _customer_history(idx: int, cfg: SynthConfig, world: World, ct_events: list[dict], seed_seq) -> tuple:
    """All transactions, the profile row and the fraud cases of customer ``idx``."""
    rng = np.random.default_rng(seed_seq)
    customer = _Customer(idx, cfg, world, rng)
    start = pd.Timestamp(cfg.start, tz="UTC")
    days = pd.date_range(start, periods=cfg.n_days, freq="D")
    history = customer.legitimate(start.weekday(), days.day.to_numpy())
    difficulty, behaviour = cfg.difficulty, cfg.behaviour
    period = cfg.n_days * 86400
    # each pattern's expected cases: its share of the target fraud, over its case size
    case_rate = {pattern: cfg.pattern_mix.get(pattern, 0) * cfg.target_fraud_rate * customer.expected
                 / CASE_SIZE[pattern] for pattern in PATTERNS}
    blocks, cases = [history], []
    home_tz = int(world.city_tz[customer.home])

    def add_case(fraud_type: str, block: dict, compromise_merchant: int | None = None) -> None:
        cases.append({"case": len(cases), "fraud_type": fraud_type, "start": int(block["t"].min()),
                      "end": int(block["t"].max()), "n_txns": len(block["t"]), "compromise_merchant": compromise_merchant})
        block["fraud"][:] = 1
        block["case"][:] = len(cases) - 1
        blocks.append(block)

    for _ in range(rng.poisson(case_rate["account_takeover"])):
        block = account_takeover_block(rng, world, customer.mcc_weights, history["amount"], difficulty, home_tz,
                                       TAKEOVER_DEVICE + len(cases), (0, period), behaviour)
        add_case("account_takeover", block)
    for _ in range(rng.poisson(case_rate["counterfeit_after_compromise"]) if len(world.compromised) else 0):
        exposure, spree, merchant = _counterfeit_case(rng, world, customer.home, difficulty, behaviour)
        blocks.append(exposure)
        add_case("counterfeit_after_compromise", spree, compromise_merchant=merchant)
    card_changes = []  # (end of a lost/stolen spree, when the customer's new card starts)
    for _ in range(rng.poisson(case_rate["lost_stolen"])):
        block = lost_stolen_block(rng, world, customer.home, difficulty, home_tz, (0, period), behaviour)
        add_case("lost_stolen", block)
        spree_end = block["t"][-1]
        card_changes.append((int(spree_end), int(spree_end + rng.uniform(*behaviour.ls_new_card_days) * 86400)))
    for event in ct_events:  # card testing: drawn at campaign level
        block = txn_block(len(event["t"]), t=event["t"], merchant=event["merchant"], amount=event["amount"],
                          txn_type=event["txn_type"], entry=ECOMMERCE, auth=event["auth"], device=event["device"],
                          response=event["response"], tz=home_tz)
        add_case("card_testing", block)
    # the bank's period only; after a lost/stolen spree, silence until the new card
    out = _concat(blocks)
    keep = (out["t"] >= 0) & (out["t"] < period)
    for end, resume in card_changes:
        keep &= ~((out["t"] > end) & (out["t"] < resume) & (out["fraud"] == 0))
        out["card"] += (out["t"] >= resume).astype(np.int64)
    out = {column: values[keep] for column, values in out.items()}
    order = np.lexsort((np.arange(len(out["t"])), out["t"]))
    out = {column: values[order] for column, values in out.items()}
    profile = {"customer_id": f"C{idx:06d}", "home_lat": customer.home_lat, "home_lon": customer.home_lon,
               "home_city": f"city_{customer.home:02d}", "home_country": "US", "archetype": customer.archetype,
               "income_band": customer.income_band}
    for case, delay in zip(cases, _label_delay(rng, len(cases), behaviour)):
        case["label_delay"] = float(delay)
    return out, profile, cases


# -- card testing: campaigns drawn once for the bank --------------------------------------------------------
def _card_testing(cfg: SynthConfig, world: World, rng: np.random.Generator) -> dict[int, list[dict]]:
    """Campaigns: a fraud device and 1-2 online merchants hit 5-40 customers within 2 h. Returns
    ``customer -> its attempts`` (:func:`card_testing_attempts`), one entry per campaign that hit it."""
    behaviour = cfg.behaviour
    mean_rate = np.mean([row[0] for row in ARCHETYPES.values()]) * 1.07  # x about the mean of day_factors
    total = (cfg.pattern_mix.get("card_testing", 0) * cfg.target_fraud_rate * mean_rate * cfg.n_days
             * cfg.n_customers)
    # the victim count is drawn once (so the realised rate is not at the mercy of a few big campaigns),
    # then cut into campaigns of 5-40 victims
    n_victims = min(cfg.n_customers * 3, int(rng.poisson(total / CASE_SIZE["card_testing"]))) if total > 0 else 0
    sizes = []
    while sum(sizes) < n_victims:
        sizes.append(min(int(rng.integers(*behaviour.ct_victims)), n_victims - sum(sizes), cfg.n_customers))
    pool = np.concatenate([world.online.get(MCC_INDEX[code], np.zeros(0, int)) for code in CT_MCCS])
    cashout = np.concatenate([world.online.get(MCC_INDEX[code], np.zeros(0, int)) for code in CT_CASHOUT_MCCS])
    events: dict[int, list[dict]] = {}
    for campaign, size in enumerate(sizes):
        merchants = _pick(rng, pool, int(rng.integers(*behaviour.ct_merchants)))
        campaign_start = int(rng.integers(0, cfg.n_days * 86400))
        for victim in rng.choice(cfg.n_customers, size, replace=False):
            events.setdefault(int(victim), []).append(card_testing_attempts(
                rng, merchants, cashout, campaign_start, CAMPAIGN_DEVICE + campaign, cfg.difficulty, behaviour))
    return events


def card_testing_attempts(rng: np.random.Generator, merchants: np.ndarray, cashout: np.ndarray, t0: int, device: int,
                          difficulty: float, behaviour: BehaviourConfig = DEFAULT_BEHAVIOUR) -> dict:
    """One victim's card-testing attempts (defaults of ``behaviour``): 3-20 tries at ``merchants``
    from ``device``, 5 s-10 min apart, starting within 2 h of ``t0`` (seconds from the bank's start);
    $0 verifications or $0.50-12 charges, 40% declined; when any went through, w.p. 0.6 one to three
    cash-out purchases ($200-1,500 at ``cashout`` merchants) 10 min-24 h later. Returns the event
    columns ``t``, ``merchant``, ``amount``, ``txn_type``, ``auth``, ``device``, ``response``."""
    count = int(rng.integers(*behaviour.ct_attempts))
    times = t0 + int(rng.integers(0, behaviour.ct_start_s)) + np.cumsum(rng.integers(*behaviour.ct_gap_s, count))
    zero = rng.random(count) < behaviour.ct_zero_share
    low, high = behaviour.ct_amount if difficulty > 0 else behaviour.ct_amount_easy
    amount = np.where(zero, 0.0, np.round(rng.uniform(low, high, count), 2))
    declined = rng.random(count) < behaviour.ct_decline_share
    response = np.where(declined, rng.choice([BAD_CVV, BAD_EXPIRY, DO_NOT_HONOR], count,
                                             p=list(behaviour.ct_decline_mix)), APPROVED)
    event = {"t": times, "merchant": _pick(rng, merchants, count), "amount": amount,
             "txn_type": np.where(zero, VERIFICATION, PURCHASE), "auth": np.full(count, NO_AUTH),
             "device": np.full(count, device), "response": response}
    # cash-out: a few large online purchases once a card proved good
    if (~declined).any() and rng.random() < behaviour.ct_cashout_share and len(cashout):
        n_cashouts = int(rng.integers(*behaviour.ct_cashouts))
        cashout_times = (times[-1] + int(rng.integers(*behaviour.ct_cashout_delay_s))
                     + np.cumsum(rng.integers(*behaviour.ct_cashout_gap_s, n_cashouts)))
        event = {"t": np.r_[times, cashout_times], "merchant": np.r_[event["merchant"], _pick(rng, cashout, n_cashouts)],
                 "amount": np.r_[amount, np.round(rng.uniform(*behaviour.ct_cashout_amount, n_cashouts), 2)],
                 "txn_type": np.r_[event["txn_type"], np.zeros(n_cashouts, int)],
                 "auth": np.r_[event["auth"], np.full(n_cashouts, THREE_DS_FRICTIONLESS)],
                 "device": np.r_[event["device"], np.full(n_cashouts, device)],
                 "response": np.r_[response, np.zeros(n_cashouts, int)]}
    return event


# -- the whole bank --------------------------------------------------------------------------------------
def _streams(cfg: SynthConfig) -> list[np.random.SeedSequence]:
    """The four independent streams of ``cfg``'s seed: world, merchants, card-testing campaigns,
    customers (each customer spawns its own from the last)."""
    return np.random.SeedSequence(int(cfg.seed)).spawn(4)


def world_of(cfg: SynthConfig) -> World:
    """The world (cities, merchants, compromised merchants) that :func:`generate` builds for ``cfg``."""
    world_stream, merchant_stream, _, _ = _streams(cfg.validate())
    return build_world(cfg, np.random.default_rng(world_stream), np.random.default_rng(merchant_stream))


def _mean_int(bounds: tuple[int, int]) -> float:
    """Mean of numpy's ``integers(lo, hi)``: ``(lo + hi - 1) / 2``."""
    return (bounds[0] + bounds[1] - 1) / 2


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
    behaviour = cfg.behaviour
    first, last = float(first_day), float(cfg.n_days if last_day is None else last_day)
    world_stream, merchant_stream, fraud_stream, _ = _streams(cfg)
    world = build_world(cfg, np.random.default_rng(world_stream), np.random.default_rng(merchant_stream))
    out: dict[str, dict] = {}
    # card testing: count the drawn campaigns' transactions in the days
    cases = frauds = 0
    for events in _card_testing(cfg, world, np.random.default_rng(fraud_stream)).values():
        for event in events:
            inside = int(((event["t"] >= first * 86400) & (event["t"] < last * 86400)
                          & (event["t"] < cfg.n_days * 86400)).sum())
            cases, frauds = cases + (inside > 0), frauds + inside
    out["card_testing"] = {"cases": float(cases), "frauds": float(frauds), "exact": True}
    # the others: expected cases per customer x the share of them that start in the days
    start = pd.Timestamp(cfg.start, tz="UTC")
    day_of_month = pd.date_range(start, periods=cfg.n_days, freq="D").day.to_numpy()
    legit = np.mean([row[0] for row in ARCHETYPES.values()]) * day_factors(behaviour, start.weekday(),
                                                                           day_of_month).sum()
    uniform = max(0.0, min(last, cfg.n_days) - max(first, 0.0)) / cfg.n_days
    share = {"account_takeover": uniform, "lost_stolen": uniform, "counterfeit_after_compromise": 0.0}
    if len(world.compromised):  # spree start uniform in [s + d, e + d) days for window [s, e) and delay d
        delay = np.arange(*behaviour.cf_delay_days)[None, :]
        window_start = world.compromised[:, 1:2].astype(float)
        window_end = world.compromised[:, 2:3].astype(float)
        overlap = np.clip(np.minimum(window_end + delay, min(last, cfg.n_days)) - np.maximum(window_start + delay, first),
                          0, None)
        share["counterfeit_after_compromise"] = float((overlap / (window_end - window_start)).mean())
    size = {"account_takeover": _mean_int(behaviour.ato_purchases) + behaviour.ato_verification_share,
            "counterfeit_after_compromise": _mean_int(behaviour.cf_purchases),
            "lost_stolen": _mean_int(behaviour.ls_purchases)}
    for pattern in ("account_takeover", "counterfeit_after_compromise", "lost_stolen"):
        expected = (cfg.n_customers * cfg.pattern_mix.get(pattern, 0) * cfg.target_fraud_rate * legit
                    / CASE_SIZE[pattern] * share[pattern])
        out[pattern] = {"cases": float(expected), "frauds": float(expected * size[pattern]), "exact": False}
    return {pattern: out[pattern] for pattern in PATTERNS}


def blocks_to_frame(blocks: list[dict], w: World, cfg: SynthConfig, customer: int, first_k: int,
                    fraud_type: str | None = None, case: int = 0) -> pd.DataFrame:
    """Transaction rows (the exported columns) of ``customer`` from generator blocks, numbered from
    ``first_k``; with ``fraud_type`` every row is a fraud of case ``case`` whose label is available
    at the case's end."""
    columns = _concat(blocks)
    columns["cust"] = np.full(len(columns["t"]), customer)
    columns["k"] = first_k + np.arange(len(columns["t"]))
    case_rows = []
    if fraud_type is not None:
        columns["fraud"][:] = 1
        columns["case"][:] = case
        case_rows = [{"customer": customer, "case": case, "fraud_type": fraud_type, "end": int(columns["t"].max()),
                      "label_delay": 0.0}]
    return _to_frame([columns], w, pd.Timestamp(cfg.start, tz="UTC"), case_rows)


def generate(cfg: SynthConfig, chunk_size: int = 500, progress: bool = False) -> SynthData:
    """Generate the bank of ``cfg`` (identical for every ``chunk_size``)."""
    cfg.validate()
    world_stream, merchant_stream, fraud_stream, customer_stream = _streams(cfg)
    world = build_world(cfg, np.random.default_rng(world_stream), np.random.default_rng(merchant_stream))
    card_testing = _card_testing(cfg, world, np.random.default_rng(fraud_stream))
    start = pd.Timestamp(cfg.start, tz="UTC")
    frames, profiles, case_rows = [], [], []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.n_customers, desc="customers", unit="cust")
    # customers in chunks (one frame each); customer i draws from its own child stream
    for chunk_start in range(0, cfg.n_customers, chunk_size):
        chunk = []
        for customer in range(chunk_start, min(cfg.n_customers, chunk_start + chunk_size)):
            seed_seq = np.random.SeedSequence(customer_stream.entropy, spawn_key=(*customer_stream.spawn_key, customer))
            history, profile, cases = _customer_history(customer, cfg, world, card_testing.get(customer, []), seed_seq)
            history["cust"] = np.full(len(history["t"]), customer)
            history["k"] = np.arange(len(history["t"]))
            chunk.append(history)
            profiles.append(profile)
            case_rows.extend({**case, "customer": customer} for case in cases)
        frames.append(_to_frame(chunk, world, start, case_rows))
        if bar:
            bar.update(min(cfg.n_customers, chunk_start + chunk_size) - chunk_start)
    if bar:
        bar.close()
    transactions = pd.concat(frames, ignore_index=True)
    for column in ("merchant_city", "device_id", "fraud_type", "fraud_case_id"):
        transactions[column] = transactions[column].astype("str")  # one dtype whatever a chunk held
    transactions = transactions.sort_values(["timestamp", "transaction_id"], kind="stable").reset_index(drop=True)
    fraud_cases = pd.DataFrame([{
        "case_id": f"F{row['customer']:06d}_{row['case']:02d}", "customer_id": f"C{row['customer']:06d}",
        "fraud_type": row["fraud_type"], "start": start + pd.to_timedelta(row["start"], unit="s"),
        "end": start + pd.to_timedelta(row["end"], unit="s"), "n_txns": row["n_txns"],
        "compromise_merchant_id": (None if row["compromise_merchant"] is None
                                   else f"M{row['compromise_merchant']:06d}"),
    } for row in case_rows], columns=["case_id", "customer_id", "fraud_type", "start", "end", "n_txns",
                                      "compromise_merchant_id"])
    return SynthData(transactions, pd.DataFrame(profiles), _merchant_table(world, start), fraud_cases)


# -- the exported tables ----------------------------------------------------------------------------------
def _to_frame(chunk: list[dict], w: World, start, case_rows: list[dict]) -> pd.DataFrame:
    """The transactions table of ``chunk`` (blocks with ``cust`` and ``k``, the customer and its row
    number); ``case_rows`` give each fraud its pattern, case id and label time."""
    world = w
    columns = {column: np.concatenate([block[column] for block in chunk]) for column in (*COLS, "cust", "k")}
    merchant, customer = columns["merchant"], columns["cust"]
    # labels: a fraud's pattern, its case and when its label is known (the case's end + the label delay)
    case_of = {(row["customer"], row["case"]): row for row in case_rows}
    fraud = columns["fraud"].astype(bool)
    fraud_type = np.array([None] * len(merchant), dtype=object)
    fraud_case = np.array([None] * len(merchant), dtype=object)
    available = np.full(len(merchant), np.nan)
    for row_index in np.flatnonzero(fraud):
        case = case_of[(int(customer[row_index]), int(columns["case"][row_index]))]
        fraud_type[row_index] = case["fraud_type"]
        fraud_case[row_index] = f"F{int(customer[row_index]):06d}_{case['case']:02d}"
        available[row_index] = case["end"] + round(case["label_delay"])
    label_at = start + pd.to_timedelta(np.where(fraud, available, 0), unit="s")
    # device ids: a customer's own, or a card-testing campaign's (shared across its victims)
    device = columns["device"]
    own = np.char.add(np.char.add(np.char.add("D", customer.astype(str)), "_"), device.astype(str))
    campaign = np.char.add("FD", (device - CAMPAIGN_DEVICE).astype(str))
    device_id = np.where(device >= CAMPAIGN_DEVICE, campaign, np.where(device >= 0, own, None))
    customer_number = np.char.zfill(customer.astype(str), 6)
    return pd.DataFrame({
        "transaction_id": np.char.add(np.char.add("T", customer_number), np.char.zfill(columns["k"].astype(str), 5)),
        "customer_id": np.char.add("C", customer_number),
        "card_id": np.char.add(np.char.add(np.char.add("K", customer_number), "_"), columns["card"].astype(str)),
        "timestamp": (start + pd.to_timedelta(columns["t"], unit="s")).astype("datetime64[us, UTC]"),
        "tz_offset_min": columns["tz"].astype(np.int16),
        "amount": columns["amount"].round(2),
        "currency": np.where(world.merchant_online[merchant],
                             np.where(world.merchant_country[merchant] == "US", "USD", world.merchant_currency[merchant]),
                             world.merchant_currency[merchant]),
        "txn_type": np.array(TXN_TYPES)[columns["txn_type"]],
        "mcc": MCC[world.merchant_mcc[merchant]].astype(np.int64),
        "merchant_id": np.char.add("M", np.char.zfill(merchant.astype(str), 6)),
        "merchant_name": np.char.add("Merchant ", merchant.astype(str)),
        "merchant_city": np.where(world.merchant_city[merchant] >= 0,
                                  np.char.add("city_", world.merchant_city[merchant].astype(str)), None),
        "merchant_country": world.merchant_country[merchant],
        "merchant_lat": world.merchant_lat[merchant].round(5),
        "merchant_lon": world.merchant_lon[merchant].round(5),
        "entry_mode": np.array(ENTRY)[columns["entry"]],
        "auth_method": np.array(AUTH)[columns["auth"]],
        "device_id": device_id,
        "response_code": np.array(RESP)[columns["response"]],
        "is_fraud": fraud.astype(np.int8),
        "fraud_type": fraud_type,
        "fraud_case_id": fraud_case,
        "label_available_at": pd.Series(label_at.astype("datetime64[us, UTC]")).where(fraud),
    })


def _merchant_table(world: World, start) -> pd.DataFrame:
    """The merchants table, with each compromised merchant's skimming window."""
    n_merchants = len(world.merchant_mcc)
    compromised_from = np.full(n_merchants, np.nan)
    compromised_to = np.full(n_merchants, np.nan)
    for merchant, first_day, end_day in world.compromised:
        compromised_from[merchant], compromised_to[merchant] = first_day * 86400, end_day * 86400
    compromised = ~np.isnan(compromised_from)
    return pd.DataFrame({
        "merchant_id": [f"M{number:06d}" for number in range(n_merchants)],
        "name": [f"Merchant {number}" for number in range(n_merchants)],
        "mcc": MCC[world.merchant_mcc], "is_online": world.merchant_online,
        "city": [f"city_{city}" if city >= 0 else None for city in world.merchant_city], "country": world.merchant_country,
        "lat": world.merchant_lat, "lon": world.merchant_lon,
        "compromised_from": pd.Series(start + pd.to_timedelta(np.nan_to_num(compromised_from), unit="s")).where(compromised),
        "compromised_to": pd.Series(start + pd.to_timedelta(np.nan_to_num(compromised_to), unit="s")).where(compromised),
    })
