#!/usr/bin/perl
# Does a block of output quoted in a lab README still have the shape of what its command prints?
#
#   tests/labs/output_shapes.pl QUOTED ACTUAL
#
# A line's shape is the line with every number replaced by '#' and runs of blanks made one blank,
# so column headers, labels and the number of fields per line count, and the noisy digits do not.
# The first or second word after a number drops a plural s ('# rounds' and '# round', '# interleaved
# repeats' and '# interleaved repeat' are one shape): the output says "1 round" and "9 rounds",
# and a lab's run may use another count than its quote.
# A quote may write … where a number goes (to show the layout without quoting noisy digits).
# Every non-blank quoted line's shape must appear among the shapes of ACTUAL, in the same order
# (a quote may leave lines out, never add or reorder them). Exit 0 when it does; otherwise exit 1
# and name the first quoted line that has no match.
use strict;
use warnings;
use utf8;
use open qw(:std :encoding(UTF-8));

sub shape {
  my ($line) = @_;
  $line =~ s/[-+−]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?/#/g;
  $line =~ s/…/#/g;
  $line =~ s/# (\w+ )?(\w+?)s\b/'# ' . ($1 \/\/ '') . $2/ge;
  $line =~ s/\s+/ /g;
  $line =~ s/^ | $//g;
  return $line;
}

sub shapes_of {
  my ($path) = @_;
  open(my $fh, '<', $path) or die "output_shapes.pl: cannot read $path: $!\n";
  my @s = grep { $_ ne '' } map { chomp; shape($_) } <$fh>;
  close($fh);
  return @s;
}

die "usage: output_shapes.pl QUOTED ACTUAL\n" unless @ARGV == 2;
my @quoted = shapes_of($ARGV[0]);
my @actual = shapes_of($ARGV[1]);
my $k = 0;
for my $q (@quoted) {
  $k++ while $k < @actual && $actual[$k] ne $q;
  if ($k == @actual) {
    print "no line of the output has the shape of the quoted line\n    $q\n",
      "  (shapes: numbers as #; after the lines matched so far). The output's shapes:\n";
    print "    $_\n" for @actual;
    exit 1;
  }
  $k++;
}
exit 0;
