# Sourced by the scripts that measure or continue earlier drafters: `folders_at COMMIT` extracts the drafters/ folder
# as committed at COMMIT into runs/drafters-COMMIT/ (once) and prints that path. drafters/ holds only the latest run's
# folders; the earlier ones stay in git history.
folders_at() {
  local dir="runs/drafters-$1"
  if [[ ! -d "$dir" ]]; then
    mkdir -p "$dir.tmp" && git archive "$1" drafters | tar -x -C "$dir.tmp" --strip-components=1 && mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}
# The third training run's shipped folders (the last commit with them): where the sweep and the fourth run start.
THIRD_RUN=8fcbcce
# The fourth run's (shipped at this commit): where the fifth run starts.
FOURTH_RUN=98625d6
# The fifth run's (shipped at this commit): where the sixth run starts.
FIFTH_RUN=4c8f9e1
# The sixth run's (shipped at this commit): where the seventh run starts.
SIXTH_RUN=d2f5499
# The seventh run's (shipped at this commit): where the eighth run starts.
SEVENTH_RUN=dbe108d
# The eighth run's (shipped at this commit): where the ninth run and the capacity probe start.
EIGHTH_RUN=c43fb74
# The ninth run's (shipped at this commit): where the slot-truncation A/B (`slots-ab`) starts.
NINTH_RUN=08ce78a
# The tenth run's (shipped at this commit).
TENTH_RUN=19f35a0
# The eleventh run's (shipped at this commit).
ELEVENTH_RUN=087b819
