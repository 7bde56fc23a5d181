//! Test-model builders (filled in below).
