"""The currency prices are given in: its code names the cost rows ("CNY per PFLOP-hour"), its
symbol writes the amounts ("¥0.52"). gpuvet converts nothing: every price of one comparison is
in the one currency the user names (`--currency CNY`, or the symbol written with a price)."""

from __future__ import annotations

import re
from dataclasses import dataclass

SYMBOLS = {"USD": "$", "CNY": "¥", "EUR": "€", "GBP": "£", "JPY": "¥", "KRW": "₩", "INR": "₹", "HKD": "HK$",
           "SGD": "S$", "AUD": "A$", "CAD": "C$", "TWD": "NT$", "RUB": "₽", "BRL": "R$"}
# A symbol written before a price ("¥3.5", "RMB 3.5"): the currency it names; "¥" is taken as
# CNY, the renters' one in gpuvet's sources (give --currency JPY for yen).
_WRITTEN = {"$": "USD", "US$": "USD", "¥": "CNY", "￥": "CNY", "RMB": "CNY", "元": "CNY", "€": "EUR", "£": "GBP",
            "₩": "KRW", "₹": "INR", "HK$": "HKD", "S$": "SGD", "A$": "AUD", "C$": "CAD", "NT$": "TWD", "₽": "RUB",
            "R$": "BRL"}
_PRICE = re.compile(r"^\s*(?P<before>[^\d\s.+-]*)\s*(?P<amount>[+-]?[\d.,eE+-]+)\s*(?P<after>[^\d\s.]*)\s*$")


@dataclass(frozen=True)
class Currency:
    code: str  # ISO 4217, e.g. "CNY"
    symbol: str  # "¥"; a currency without a known symbol is written with its code ("CHF 3.20")

    def amount(self, value: float) -> str:
        number = f"{value:,.2f}" if abs(value) >= 0.1 else f"{value:.4f}"
        return f"{self.symbol}{number}" if self.symbol != self.code else f"{number} {self.code}"

    def per_hour(self, value: float) -> str:
        return f"{self.amount(value)}/h"


USD = Currency("USD", "$")


def currency(code: str) -> Currency:
    """The currency of an ISO 4217 code (three letters); ValueError for anything else."""
    code = code.strip().upper()
    code = "CNY" if code == "RMB" else code
    if not re.fullmatch(r"[A-Z]{3}", code):
        raise ValueError(f"--currency {code!r}: give a three-letter currency code, e.g. USD, CNY, EUR")
    return Currency(code, SYMBOLS.get(code, code))


def split_price(text: str) -> tuple[str, str | None]:
    """"¥3.5" -> ("3.5", "CNY"); "3.5" -> ("3.5", None); a symbol gpuvet does not know is left in
    the amount (and refused by the price check)."""
    match = _PRICE.match(text)
    if not match:
        return text, None
    written = (match["before"] or match["after"]).strip()
    if not written:
        return match["amount"], None
    code = _WRITTEN.get(written.upper() if written.isascii() else written) or (
        written.upper() if re.fullmatch(r"[A-Za-z]{3}", written) else None)
    return (match["amount"], code) if code else (text, None)
